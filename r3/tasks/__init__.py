"""tasks/: prompts and their rewards, `(reward, info)`. May import r3.errors, model/, runs/ and scale/.

  tasks.py       the toy tasks (cipher, sort, chain, walk); imports nothing from r3 but its error types
  jsonl_task.py  a JSONL file of prompts and answers, tokenised by the checkpoint's tokenizer (scale/hf.py)
"""
