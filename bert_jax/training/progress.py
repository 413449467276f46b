"""Progress of a long job: a tqdm bar on a terminal, a plain log line per ``log_every`` steps
otherwise, with steps/s, examples/s and the ETA."""

from __future__ import annotations

import sys
import time


class Progress:
    """A tqdm bar on a terminal, a plain log line per ``log_every`` steps otherwise."""

    def __init__(self, start: int, total: int, examples_per_step: int, enabled: bool):
        self.start, self.total, self.per_step = start, total, examples_per_step
        self.t0, self.last_t, self.last_step = time.time(), time.time(), start
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)
        self.enabled = enabled

    def update(self, step: int) -> None:
        if self.bar is not None:
            self.bar.update(step - self.bar.n)

    def report(self, step: int, metrics: dict) -> dict:
        now = time.time()
        rate = (step - self.last_step) / max(now - self.last_t, 1e-9)
        self.last_t, self.last_step = now, step
        eta = (self.total - step) / max(rate, 1e-9)
        per_step = metrics.get("examples", self.per_step)  # packed rows hold several examples
        timing = {"steps_per_sec": rate, "examples_per_sec": rate * per_step}
        if self.enabled:
            shown = " ".join(f"{name} {metrics[k]:.4f}" for k, name in
                             (("loss", "loss"), ("mlm_accuracy", "mlm_acc"), ("accuracy", "acc"),
                              ("token_spread", "spread")) if k in metrics)
            text = (f"step {step}/{self.total} {shown} "
                    f"| {rate:.2f} steps/s {rate * per_step:.0f} ex/s | ETA {eta / 60:.1f} min")
            if self.bar is not None:
                self.bar.set_postfix_str(f"loss {metrics['loss']:.3f}")
                self.bar.write(text)
            else:
                print(text, flush=True)
        return timing

    def close(self):
        if self.bar is not None:
            self.bar.close()
