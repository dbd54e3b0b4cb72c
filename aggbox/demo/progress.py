"""The progress display: one line per stage, a spinner while it runs, ✓ and its duration
when done (✗ when it failed)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

__all__ = ["Stages"]


class Stages:
    """``with Stages(console) as stages: with stages.step("Doing X"): ...``"""

    def __init__(self, console: Console) -> None:
        self.progress = Progress(
            SpinnerColumn(finished_text="[green]✓[/]"),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def __enter__(self) -> Stages:
        self.progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.progress.stop()

    @contextmanager
    def step(self, description: str) -> Iterator[None]:
        task = self.progress.add_task(description, total=1)
        try:
            yield
        except BaseException:
            self.progress.update(task, description=f"[red]✗ {description} (failed)[/]")
            self.progress.stop_task(task)
            raise
        self.progress.update(task, completed=1)
