import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

torch.set_num_threads(1)  # tiny models gain nothing from more, and oversubscribed cores slow down a lot
