"""tools/: commands on top of everything. May import r3.errors and every wing.

  check.py    the route checker: recorded routes against the trainer's own, layer by layer (`python -m r3.check`)
  inspect.py  the mismatch inspector: which tokens disagree, at which layers (`python -m r3.inspect`)
  serve.py    a stand-in server speaking SGLang's HTTP protocol in front of our engine (`python -m r3.serve`)
  export.py   a run or a preset as an HF folder real engines serve (`python -m r3.tools.export`)
"""
