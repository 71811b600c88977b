"""Wire codec benchmark: ``transports.encode``/``decode`` against pickle and torch.save.

Encodes and decodes a TensorDict of float32 leaves (1 MB and 256 MB) with

* the asyncrl codec, frames handed over as they are (what a zero-copy send and
  receive see),
* the asyncrl codec plus one copy of every frame into ``bytes`` (what a copying
  transport, or a network receive buffer, costs),
* ``pickle.dumps``/``loads`` (protocol 5, in-band: one bytes object),
* ``torch.save``/``torch.load`` into an ``io.BytesIO``,

and reports medians, p90s and ratios against the codec. It then checks that
decoding 256 MB received over a real ZeroMQ socket copies nothing: every
decoded tensor lies inside its received frame and the resident set barely
grows while decoding.

    python -m benchmarks.codec            # full run (1 MB and 256 MB)
    python -m benchmarks.codec --quick    # smoke run (1 MB and 16 MB)
    python -m benchmarks.codec --messages # only: decoding each message kind's body

``--messages`` times :func:`asyncrl._protocol.decode` on each kind's body as the
hub hands it over (encoded and decoded by the codec first): the validation a
trainer or worker pays per message, on top of the codec.
"""

from __future__ import annotations

import argparse
import gc
import io
import multiprocessing
import os
import pickle
import platform
import resource
import shlex
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensordict
import torch
import zmq
from tensordict import TensorDict

import transports

MB = 1 << 20
LEAVES = ("observation", "next_observation", "action_logits", "value_targets")

Encode = Callable[[TensorDict], Any]
Decode = Callable[[Any], Any]


@dataclass(frozen=True)
class Method:
    """A way to turn a TensorDict into wire data and back."""

    name: str
    encode: Encode
    decode: Decode


@dataclass(frozen=True)
class Result:
    """Timings (seconds) of one method on one payload size."""

    method: str
    size_mb: float
    encode: list[float]
    decode: list[float]

    @property
    def total(self) -> list[float]:
        return [e + d for e, d in zip(self.encode, self.decode, strict=True)]


def _copy_frames(td: TensorDict) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in transports.encode(td)]


def _pickle_dumps(td: TensorDict) -> bytes:
    return pickle.dumps(td, protocol=5)


def _torch_save(td: TensorDict) -> bytes:
    buffer = io.BytesIO()
    torch.save(td, buffer)
    return buffer.getvalue()


def _torch_load(data: bytes) -> Any:
    # weights_only=False: a TensorDict is not on torch's weights-only allow list.
    return torch.load(io.BytesIO(data), weights_only=False)


METHODS = (
    Method("asyncrl codec (zero-copy frames)", transports.encode, transports.decode),
    Method("asyncrl codec + 1 copy per frame", _copy_frames, transports.decode),
    Method("pickle protocol 5 (in-band)", _pickle_dumps, pickle.loads),
    Method("torch.save / torch.load (BytesIO)", _torch_save, _torch_load),
)


def make_batch(nbytes: int) -> TensorDict:
    """A TensorDict of four float32 leaves, ``nbytes`` in total, batch size [rows]."""
    columns = 64
    rows = max(1, nbytes // (len(LEAVES) * columns * 4))
    generator = torch.Generator().manual_seed(0)
    leaves = {k: torch.randn(rows, columns, generator=generator) for k in LEAVES}
    return TensorDict(leaves, batch_size=[rows])


def check_equal(got: Any, want: TensorDict) -> None:
    """Fail loudly if a method does not round-trip (a benchmark of a wrong answer is void)."""
    for key in LEAVES:
        if not torch.equal(got[key], want[key]):
            raise AssertionError(f"round trip changed leaf {key!r}")


def time_method(method: Method, td: TensorDict, repeat: int) -> Result:
    """One checked warm-up, then ``repeat`` timed encode/decode pairs (gc off, as timeit)."""
    check_equal(method.decode(method.encode(td)), td)
    encode_s, decode_s = [], []
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            wire = method.encode(td)
            middle = time.perf_counter()
            out = method.decode(wire)
            end = time.perf_counter()
            encode_s.append(middle - start)
            decode_s.append(end - middle)
            del wire, out  # refcounting frees the payload before the next round
    finally:
        gc.enable()
    size_mb = sum(t.numel() * t.element_size() for t in td.values()) / MB
    return Result(method.name, size_mb, encode_s, decode_s)


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def _p90(values: Sequence[float]) -> float:
    return float(np.percentile(values, 90))


def _ratio(value: float, baseline: float) -> str:
    ratio = value / baseline if baseline > 0 else float("nan")
    return f"{ratio:.0f}" if ratio >= 100 else f"{ratio:.1f}"


def format_table(results: list[Result]) -> str:
    """Markdown, one row per (size, method). Ratios divide a method's median
    encode+decode by the codec's: as is (zero-copy) and with one copy per frame
    (the fair reference when the bytes really cross a network)."""
    lines = [
        "| payload | method | encode+decode median ms | p90 ms | encode ms | decode ms "
        "| ratio to codec | ratio to codec + 1 copy |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    baselines: dict[float, list[float]] = {}
    for r in results:
        median = statistics.median(r.total)
        base = baselines.setdefault(r.size_mb, [])
        if len(base) < 2:  # METHODS starts with the codec, then the codec + 1 copy
            base.append(median)
        lines.append(
            f"| {r.size_mb:.0f} MB | {r.method} | {_ms(median)} | {_ms(_p90(r.total))} "
            f"| {_ms(statistics.median(r.encode))} | {_ms(statistics.median(r.decode))} "
            f"| {_ratio(median, base[0])} | {_ratio(median, base[-1])} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ zero-copy check


def _rss_bytes() -> int:
    """Current resident set size (Linux /proc); falls back to the peak from getrusage."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _inside(tensor: torch.Tensor, frame: zmq.Frame) -> bool:
    start = np.frombuffer(frame.buffer, dtype=np.uint8).ctypes.data
    end = start + len(frame.buffer)
    return start <= tensor.data_ptr() and tensor.data_ptr() + tensor.nbytes <= end


def measure_zero_copy(nbytes: int) -> dict[str, float]:
    """Send a batch over a zmq inproc PAIR (zmq copies once on send, as a network
    would), receive with copy=False and decode; measure where the decoded tensors
    live and how much the resident set grows while decoding, next to pickle.loads.

    Run it in a fresh process: an allocator that already holds freed pages from
    earlier rounds hides the growth of a copying decoder.
    """
    td = make_batch(nbytes)
    ctx = zmq.Context()
    sender, receiver = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        receiver.bind("inproc://bench-codec")
        sender.connect("inproc://bench-codec")
        sender.send_multipart(transports.encode(td), copy=True)
        if not receiver.poll(60_000, zmq.POLLIN):
            raise TimeoutError("the benchmark message did not arrive within 60 s")
        frames = receiver.recv_multipart(copy=False)
        gc.collect()
        before = _rss_bytes()
        start = time.perf_counter()
        out = transports.decode(frames)
        elapsed = time.perf_counter() - start
        grown = _rss_bytes() - before
        inside = all(_inside(out[k], f) for k, f in zip(LEAVES, frames[1:], strict=True))
        check_equal(out, td)
        payload = sum(len(f.buffer) for f in frames[1:])
        pickled = pickle.dumps(td, protocol=5)
        gc.collect()
        before = _rss_bytes()
        loaded = pickle.loads(pickled)
        pickle_grown = _rss_bytes() - before
        check_equal(loaded, td)
        del loaded, pickled, out, frames
    finally:
        sender.close(linger=0)
        receiver.close(linger=0)
        ctx.term()
    return {"payload": payload, "inside": float(inside), "decode_s": elapsed,
            "grown": grown, "pickle_grown": pickle_grown}


def zero_copy_report(nbytes: int, timeout: float = 300.0) -> str:
    """Run :func:`measure_zero_copy` in a fresh (spawned) process and format it."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        m = pool.apply_async(measure_zero_copy, (nbytes,)).get(timeout=timeout)
    return "\n".join([
        f"Zero-copy check (fresh process), {m['payload'] / MB:.0f} MB received over zmq "
        "inproc with `recv_multipart(copy=False)`:",
        f"- every decoded leaf lies inside its received frame: {'yes' if m['inside'] else 'NO'}",
        f"- `decode` took {_ms(m['decode_s'])} ms; resident set grew by "
        f"{m['grown'] / MB:.1f} MB while decoding "
        f"(`pickle.loads` of the same batch: {m['pickle_grown'] / MB:.0f} MB)",
    ])


# ------------------------------------------------------------------ entry point


def machine_note() -> str:
    return (
        f"{platform.machine()}, {os.cpu_count()} CPU(s), {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}, torch {torch.__version__}, "
        f"tensordict {tensordict.__version__}, pyzmq {zmq.__version__}; "
        f"load average at start {_load_average()}"
    )


def _load_average() -> str:
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1/5/15 min)"
    except OSError:
        return "unknown"


def message_bodies() -> dict[str, tuple[type, Any, dict[str, Any]]]:
    """``{label: (kind, body as the hub hands it over, bounds)}`` of typical messages."""
    from asyncrl._protocol import (
        Batch,
        BatchSlots,
        Closing,
        Collect,
        ErrorReport,
        Hello,
        Leaving,
        LogEntry,
        Progress,
        Refuse,
        RelayAck,
        RelayAttached,
        RelayHello,
        SharedBatch,
        WeightChunk,
        WeightMeta,
        WeightsApplied,
        Welcome,
        WorkerLog,
        compact,
    )
    from asyncrl._rollout.env_ids import EnvIdSource
    from asyncrl._worker.simulated import make_share, make_specs
    from transports import ErrorPayload

    share = make_share(256, 4)
    share["observation"] = torch.randn(1, 256, 64)  # 256 B per frame: compacted
    share["next", "observation"] = torch.roll(share["observation"], -1, 1)
    wire, patch = compact(share)
    # What a trainer's refusal tells a host that lacks its gymnasium id (as admission makes it).
    source = EnvIdSource.of("CartPole-v1")
    assert source is not None
    error = ErrorReport.from_body({"type": "builtins.ValueError", "message": "bad obs",
                                   "traceback": "Traceback:\n  x\n" * 20, "fatal": True})
    messages = {
        "hello": (Hello(2, "w0", "host-a", 123, make_specs(4), token="t" * 32), {}),
        "relay_hello": (RelayHello(2, "relay", "host-a", 1, [b"w%d" % i for i in range(8)]), {}),
        "welcome": (Welcome(0, 256, schemes={"policy": {"kind": "zmq"}}), {}),
        "collect": (Collect(3, 1), {}),
        "batch (256 frames)": (Batch(3, share), {"max_frames": 256}),
        "batch (compact)": (Batch(3, wire, patch), {"max_frames": 256}),
        "shared_batch": (SharedBatch(3, "asyncrl_1_ab", 0, 256), {}),
        "error": (error, {}),
        "leaving": (Leaving("SIGTERM"), {}),
        "log (64 records)": (WorkerLog([LogEntry(20, "asyncrl.worker", f"step {i}")
                                        for i in range(64)]), {}),
        "progress": (Progress(3, 1200), {}),
        "welcome (rollout)": (Welcome(0, 256, schemes={"policy": {"kind": "zmq"}},
                                      instance="ab" * 8, rollout={"max_frames_per_traj": 100,
                                                                  "split_trajs": False}), {}),
        "batch_slots (32 keys)": (BatchSlots("asyncrl_1_ab", [("next", f"k{i}")
                                                              for i in range(32)]), {}),
        "weights ack": (WeightsApplied("policy", 7), {}),
        "relay ack (8 members)": (RelayAck("policy", {b"w%d" % i: 7 for i in range(6)}, {
            b"w6": RelayAck.lost("gone"), b"w7": ErrorPayload("builtins.ValueError", "x")}), {}),
        "relay_attached": (RelayAttached(), {}),
        "refuse (full)": (Refuse("the trainer has no free place", full=True), {}),
        "refuse (env_source, CartPole-v1)": (Refuse(
            "this host lacks the gymnasium id 'CartPole-v1'",
            env_source=source.with_package().to_body()), {}),
    }
    bodies = {label: (type(m), transports.decode(transports.encode(m.to_body())), bounds)
              for label, (m, bounds) in messages.items()}
    # Read beside a body: a weights message's meta, a close control's arguments.
    layout = tuple((f"layer{i}.weight", "float32", (256, 256)) for i in range(64))
    metas = {
        "weights meta": WeightMeta("policy", 7, "ab" * 8),
        "weights meta (relayed, 8)": WeightMeta("policy", 7, "ab" * 8,
                                                tuple(b"w%d" % i for i in range(8))),
        "weights meta (chunk 0, 64 tensors)": WeightMeta("policy", 7, "ab" * 8, chunk=WeightChunk(
            0, 4, tuple((key, 0, 1 << 18) for key, _, _ in layout[:16]), layout)),
    }
    for label, meta in metas.items():
        bodies[label] = (WeightMeta, transports.decode(transports.encode(meta.to_meta())), {})
    bodies["close arguments"] = (Closing, {"finished": False}, {})
    return bodies


def message_report(repeat: int) -> str:
    """A Markdown table: median and p90 microseconds to decode each kind's body."""
    from asyncrl._protocol import decode

    lines = ["| message | decode median (us) | p90 (us) |", "|---|---:|---:|"]
    for label, (kind, body, bounds) in message_bodies().items():
        times = []
        for _ in range(repeat):
            # A batch's rebuild writes into its frames: each decode gets its own (made
            # before the clock starts; the tensors are shared, not copied).
            bodies = [{**body, "frames": body["frames"].clone(recurse=False)}
                      if isinstance(body, dict) and "frames" in body else body
                      for _ in range(100)]
            start = time.perf_counter()
            for one in bodies:
                decode(kind, one, **bounds)
            times.append((time.perf_counter() - start) / 100 * 1e6)
        lines.append(f"| {label} | {statistics.median(times):.2f} | {_p90(times):.2f} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.codec", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed repetitions on the large payload, x10 on 1 MB "
                             "(default 15, or 3 with --quick)")
    parser.add_argument("--messages", action="store_true",
                        help="only time decoding each message kind's body")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 MB and 16 MB instead of 256 MB")
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = 3 if args.quick else 15
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print a Markdown table and the command that produced it."""
    args = parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.codec",
                          *(sys.argv[1:] if argv is None else argv)])
    sizes = [(1 * MB, args.repeat * 10), ((16 if args.quick else 256) * MB, args.repeat)]
    if args.messages:
        print(f"$ {command}\n\nMachine: {machine_note()}\n")
        print(message_report(max(args.repeat, 5) * 4))
        return 0
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    results: list[Result] = []
    for nbytes, reps in sizes:
        td = make_batch(nbytes)
        for method in METHODS:
            results.append(time_method(method, td, reps))
        del td
    gc.collect()
    print(f"$ {command}\n")
    print(f"Machine: {machine_note()}\n")
    print(format_table(results))
    print()
    print(zero_copy_report(sizes[-1][0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
