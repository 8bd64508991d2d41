"""What a training run prints as it goes: a progress bar on a terminal; otherwise (output redirected to a file,
a job log, ``--no-progress``) a plain line every ``log_every`` steps; and a closing summary either way."""

from __future__ import annotations

import shlex
import sys
import time
from typing import Callable


def format_duration(seconds: float) -> str:
    """``"42.0s"``, ``"2m57s"`` or ``"3h05m"``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    """Per-step reporting: ``update`` after every step with its metrics and its training seconds (eval and
    checkpoint time excluded). With ``bar``, a tqdm bar shows loss and tokens/s; without, every ``log_every``
    steps (and at the first and last step) ``say`` gets one line with step, loss, learning rate and tokens/s averaged
    over the steps since the previous line."""

    def __init__(self, start: int, stop: int, total: int, tokens_per_step: int, log_every: int, bar: bool,
                 say: Callable[[str], None]):
        self.start, self.stop, self.total, self.tokens_per_step = start, stop, total, tokens_per_step
        self.log_every, self.say = log_every, say
        self.first_loss = self.last_loss = None
        self.train_seconds = self.compile_seconds = 0.0
        self._since_line = [0, 0.0]  # steps and seconds since the last log line
        self.began = time.perf_counter()
        self.bar = None
        if bar:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)

    def update(self, step: int, metrics: dict, seconds: float) -> None:
        """``step`` is the 1-based number of the step just taken."""
        loss = metrics["loss"]
        self.first_loss = loss if self.first_loss is None else self.first_loss
        self.last_loss = loss
        self.train_seconds += seconds
        if step == self.start + 1:
            self.compile_seconds = seconds  # the first step compiles the train step
        self._since_line[0] += 1
        self._since_line[1] += seconds
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{self.tokens_per_step / seconds:,.0f}", refresh=False)
            self.bar.update(1)
        elif step % self.log_every == 0 or step in (self.start + 1, self.stop):
            steps, secs = self._since_line
            first = " (compiling included)" if step == self.start + 1 else ""
            self.say(f"step {step}/{self.total}  loss {loss:.4f}  lr {metrics.get('lr', 0.0):.3e}  "
                     f"tokens/s {steps * self.tokens_per_step / max(secs, 1e-9):,.0f}  "
                     f"elapsed {format_duration(time.perf_counter() - self.began)}{first}")
            self._since_line = [0, 0.0]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def summary(self, steps_done: int, eval_result: dict | None, eval_step: int | None, checkpoint: str | None,
                model_path: str) -> list[str]:
        """The closing lines: what ran, how long, the final losses and where the results are."""
        lines = []
        if steps_done == 0:
            lines.append(f"nothing to train: the run is at step {self.start} of {self.total}")
        if self.first_loss is not None:
            timed_steps = steps_done - 1 if steps_done > 1 else steps_done  # after the compiling first step
            timed_seconds = self.train_seconds - (self.compile_seconds if steps_done > 1 else 0.0)
            rate = timed_steps * self.tokens_per_step / max(timed_seconds, 1e-9)
            lines.append(f"done: {steps_done} step{'s' if steps_done != 1 else ''} ({self.start + 1}.."
                         f"{self.start + steps_done}) in "
                         f"{format_duration(time.perf_counter() - self.began)}; {rate:,.0f} tokens/s while "
                         "training")
            lines.append(f"train loss {self.first_loss:.4f} -> {self.last_loss:.4f} over steps "
                         f"{self.start + 1}..{self.start + steps_done}")
        if eval_result:
            lines.append(f"eval at step {eval_step}: " + "  ".join(  # counts as counts, the rest to 4 decimals
                f"{k} {v}" if isinstance(v, int) else f"{k} {v:.4f}" for k, v in eval_result.items()))
        if checkpoint:
            lines.append(f"checkpoint: {checkpoint}")
        command = f"tensorboard --logdir {shlex.quote(model_path)}"  # pasted into a shell: a path may hold spaces
        lines.append(f"metrics: {model_path}/metrics.jsonl; loss curves: {command}")
        return lines


def wants_bar(no_progress: bool, lead: bool, stream=None) -> bool:
    """A progress bar only on a terminal: redirected, tqdm's carriage returns make one endless line."""
    stream = sys.stderr if stream is None else stream
    return lead and not no_progress and stream.isatty()
