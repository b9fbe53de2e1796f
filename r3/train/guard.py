"""The collapse guard: watches training health for the collapse symptoms the literature reports (README, "Metrics").

Symptoms (each a name in `CollapseGuard.check`'s return):
  nonfinite        loss or pre-clip grad norm is NaN/inf
  reward_drop      the reward's running mean (EMA) fell more than `reward_drop` below its running peak
  kl_surge         mismatch kl above `kl_max`
  extreme_surge    F(τ) above `extreme_max`
  length_collapse  mean response length below `length_frac` × its value over the first `warmup` steps
  runaway          the share of responses that hit the length limit without EOS (repetition loops) rose more than
                   `runaway_frac` above its value over the first `warmup` steps
kl_surge and extreme_surge are checked on the steps that measure the mismatch (None elsewhere: --mismatch-every).
`check` returns the symptoms firing now; `new` holds those that were not firing a step earlier. The guard
only reports; train.py decides to checkpoint and stop or continue (`--on-collapse`).
"""
import math

from r3.runs.ema import EMA_DECAY, ema_update


class CollapseGuard:
    def __init__(self, *, reward_drop: float = 0.3, kl_max: float = 1.0, extreme_max: float = 0.1,
                 length_frac: float = 0.5, runaway_frac: float = 0.5, ema: float = EMA_DECAY, warmup: int = 5):
        self.cfg = dict(reward_drop=reward_drop, kl_max=kl_max, extreme_max=extreme_max, length_frac=length_frac,
                        runaway_frac=runaway_frac, ema=ema, warmup=warmup)
        self.reward_ema = None
        self.peak = -math.inf
        self.n = 0
        self.len_sum = 0.0
        self.runaway_base = 0.0
        self.active: list[str] = []  # symptoms that fired at the previous check
        self.new: list[str] = []  # symptoms that fired now but not at the previous check (onsets)

    def state_dict(self) -> dict:
        return dict(reward_ema=self.reward_ema, peak=self.peak, n=self.n, len_sum=self.len_sum,
                    runaway_base=self.runaway_base, active=self.active)

    def load_state_dict(self, s: dict) -> None:
        self.reward_ema, self.peak, self.n, self.len_sum = s["reward_ema"], s["peak"], s["n"], s["len_sum"]
        self.runaway_base, self.active = s["runaway_base"], list(s["active"])

    def check(self, m: dict) -> list[str]:
        c, fired = self.cfg, []
        if not all(math.isfinite(m[k]) for k in ("loss", "grad_norm")):
            fired.append("nonfinite")
        r = m["reward"]
        self.reward_ema = ema_update(self.reward_ema, r, c["ema"])
        self.n += 1
        if self.n <= c["warmup"]:
            self.len_sum += m["response_length"]
            self.runaway_base += m.get("runaway_frac", 0.0)
        else:
            self.peak = max(self.peak, self.reward_ema)
            if self.reward_ema < self.peak - c["reward_drop"]:
                fired.append("reward_drop")
            if m["response_length"] < c["length_frac"] * self.len_sum / c["warmup"]:
                fired.append("length_collapse")
        if m["kl"] is not None and m["kl"] > c["kl_max"]:
            fired.append("kl_surge")
        if m["extreme_frac"] is not None and m["extreme_frac"] > c["extreme_max"]:
            fired.append("extreme_surge")
        if self.n > c["warmup"] and m.get("runaway_frac", 0.0) > self.runaway_base / c["warmup"] + c["runaway_frac"]:
            fired.append("runaway")
        self.new = [s for s in fired if s not in self.active]
        self.active = fired
        return fired
