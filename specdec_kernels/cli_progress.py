"""A progress line on stderr for a long call of the CLI (stdout and --json stay clean): nothing for
a call shorter than `delay`; after it, on a terminal an elapsed-time line that updates in place and
is erased at the end, elsewhere (a log, a pipe) one line saying the call is still running."""

import sys
import threading
import time


class Progress:
    """with Progress("decoding 2 prompts x 64 tokens (speculative)"): ... ."""

    def __init__(self, label: str, stream=None, delay: float = 2.0, interval: float = 0.5):
        self.label, self.stream = label, stream if stream is not None else sys.stderr
        self.delay, self.interval = delay, interval
        self.shown = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._report, daemon=True)

    def _terminal(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def _report(self) -> None:
        start = time.perf_counter()
        if self._done.wait(self.delay):
            return
        self.shown = True
        if not self._terminal():
            print(f"{self.label}: still running after {self.delay:.0f} s ...", file=self.stream, flush=True)
            return
        while not self._done.is_set():
            self.stream.write(f"\r{self.label}: {time.perf_counter() - start:.0f} s")
            self.stream.flush()
            self._done.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        if self.shown and self._terminal():
            self.stream.write("\r\033[K")  # erase the line: what follows starts on a clean one
            self.stream.flush()
