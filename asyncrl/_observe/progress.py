"""A progress bar for a collector: frames, frames/s, episode return, policy lag, workers.

Uses tqdm (``pip install "asyncrl[progress]"``); every figure comes from
``collector.statistics()``, so the bar shows what an operator's ``/status`` or
Prometheus would.
"""

from __future__ import annotations

from typing import Any


class Progress:
    """``progress.update()`` after each batch redraws the bar from ``collector.statistics()``.

    ``total`` defaults to the collector's ``total_frames`` (none if endless);
    ``disable=True`` draws nothing (e.g. ``--no-progress``); other keyword
    arguments go to ``tqdm``.

    >>> async with MultiSyncCollector("CartPole-v1", num_workers=2,        # doctest: +SKIP
    ...                               frames_per_batch=200, total_frames=10_000) as c:
    ...     with asyncrl.Progress(c) as progress:
    ...         async for batch in c:
    ...             progress.update()
    """

    def __init__(self, collector: Any, *, total: int | None = None, disable: bool = False,
                 **tqdm_kwargs: Any) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError as exc:
            raise ImportError(
                "asyncrl.Progress needs tqdm, which the 'progress' extra installs: "
                'pip install "asyncrl[progress]" (or pip install tqdm)') from exc
        self.collector = collector
        if total is None:
            frames = getattr(collector, "total_frames", -1)
            total = frames if isinstance(frames, int) and frames >= 0 else None
        options: dict[str, Any] = {"unit": "frame", "unit_scale": True, "dynamic_ncols": True}
        options.update(tqdm_kwargs)
        self.bar = tqdm(total=total, disable=disable, **options)
        self._shown = 0

    def postfix(self) -> dict[str, Any]:
        """What the bar shows after the counter (override to add your own figures)."""
        stats = self.collector.statistics()
        ret = stats.episode_return_mean
        live = sum(1 for w in stats.workers if w.state in ("collecting", "idle"))
        return {"fps": f"{stats.frames_per_second:,.0f}",
                "ret": "-" if ret is None else f"{ret:.1f}",
                "lag": stats.policy_lag, "v": stats.policy_version,
                "workers": f"{live}/{len(stats.workers)}",
                **({"paused": True} if stats.paused else {})}

    def update(self, **extra: Any) -> None:
        """Advance to the collector's frame count and refresh the figures (plus ``extra``)."""
        frames = int(self.collector.statistics().frames)
        self.bar.set_postfix({**self.postfix(), **extra}, refresh=False)
        if frames > self._shown:
            self.bar.update(frames - self._shown)  # redraws (tqdm's mininterval allowing)
        else:
            self.bar.refresh()
        self._shown = frames

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


__all__ = ["Progress"]
