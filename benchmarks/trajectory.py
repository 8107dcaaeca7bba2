"""Memory and speed of TrajectoryManager on a long agent session, against a naive baseline.

The session: one linear agent run of ``--turns`` turns whose prompt grows from
``--first-prompt`` tokens to ``--tokens`` tokens (default 150 turns up to 128k tokens).
Every turn's ids arrive as fresh Python lists, as they do from a tokenizer or an HTTP body.

The baseline holds what a straightforward implementation holds: every turn's full prompt,
output and log-probs as Python lists, linearised with list operations.

Measured in one run, for both: bytes still held after all turns are recorded
(tracemalloc), time to record all turns, and ``get_trajectory`` time.

    python benchmarks/trajectory.py [--turns 150] [--tokens 131072] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
from array import array
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from agentrl.trajectory import TrajectoryManager, TurnRecord

LIMIT_BYTES = 10 * 1024 * 1024
VOCAB = 151_000


def session_turns(turns: int, total: int, first_prompt: int, seed: int = 0) -> Iterator[tuple]:
    """Yield (prompt_ids, output_ids, logprobs, prompt_messages, response_message) per turn."""
    rng = random.Random(seed)
    growth = (total - first_prompt) // turns
    output_len = max(1, growth // 3)
    tail_len = growth - output_len
    held = array("i", (rng.randrange(VOCAB) for _ in range(first_prompt)))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _text(rng, first_prompt // 2)},
        {"role": "user", "content": _text(rng, first_prompt - first_prompt // 2)},
    ]
    for index in range(turns):
        prompt = held.tolist()  # fresh int objects, like ids parsed from a request
        output = [rng.randrange(VOCAB) for _ in range(output_len)]
        logprobs = [-rng.random() for _ in range(output_len)]
        response = {"role": "assistant", "content": _text(rng, output_len)}
        yield prompt, output, logprobs, list(messages), response
        held.extend(output)
        held.extend(rng.randrange(VOCAB) for _ in range(tail_len))
        messages += [response, {"role": "tool", "content": _text(rng, tail_len), "id": index}]


def _text(rng: random.Random, tokens: int) -> str:
    # About four characters per token, like English text under a BPE vocabulary.
    return "".join(rng.choice("abcdefghij ") for _ in range(4 * tokens))


class Baseline:
    """Holds every turn's full prompt as a list and linearises with lists."""

    def __init__(self) -> None:
        self.turns: list[tuple[list[int], list[int], list[float]]] = []

    def record(self, prompt: list[int], output: list[int], logprobs: list[float]) -> None:
        self.turns.append((prompt, output, logprobs))

    def get_trajectory(self) -> list[tuple[list[int], int, list[int], list[float]]]:
        samples = []
        tokens: list[int] = []
        mask: list[int] = []
        lps: list[float] = []
        prompt_length = 0
        for prompt, output, logprobs in self.turns:
            shared = _common_prefix(tokens, prompt)
            if tokens and shared != len(tokens):
                samples.append((tokens, prompt_length, mask, lps))
                tokens, mask, lps = [], [], []
            if not tokens:
                tokens = list(prompt)
                prompt_length = len(prompt)
            else:
                tail = prompt[len(tokens) :]
                tokens.extend(tail)
                mask.extend([0] * len(tail))
                lps.extend([0.0] * len(tail))
            tokens.extend(output)
            mask.extend([1] * len(output))
            lps.extend(logprobs)
        samples.append((tokens, prompt_length, mask, lps))
        self.turns = []
        return samples


def _common_prefix(a: list[int], b: list[int]) -> int:
    limit = min(len(a), len(b))
    i = 0
    while i < limit:
        j = min(i + 4096, limit)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return limit


def record_agentrl(args: argparse.Namespace) -> tuple[float, TrajectoryManager]:
    """Record the session; return the seconds spent inside record_turn and the manager."""
    manager = TrajectoryManager()
    seconds = 0.0
    for prompt, output, logprobs, messages, response in session_turns(
        args.turns, args.tokens, args.first_prompt
    ):
        start = time.perf_counter()
        manager.record_turn(
            "s",
            TurnRecord(prompt, output, logprobs),
            prompt_messages=messages,
            response_message=response,
        )
        seconds += time.perf_counter() - start
    return seconds, manager


def record_baseline(args: argparse.Namespace) -> tuple[float, Baseline]:
    """Record the session; return the seconds spent inside record and the baseline."""
    baseline = Baseline()
    seconds = 0.0
    for prompt, output, logprobs, _, _ in session_turns(args.turns, args.tokens, args.first_prompt):
        start = time.perf_counter()
        baseline.record(prompt, output, logprobs)
        seconds += time.perf_counter() - start
    return seconds, baseline


def held_bytes(build: Callable[[], Any]) -> tuple[int, Any]:
    """Bytes still allocated once ``build()`` returns (its result kept alive)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before, kept


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=150)
    parser.add_argument("--tokens", type=int, default=128 * 1024)
    parser.add_argument("--first-prompt", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    ours_bytes, (_, manager) = held_bytes(lambda: record_agentrl(args))
    stats = manager.session_stats("s")
    manager.drop_session("s")
    del manager
    base_bytes, (_, baseline) = held_bytes(lambda: record_baseline(args))
    del baseline
    gc.collect()

    ours_record, ours_get, base_record, base_get = [], [], [], []
    for _ in range(args.repeats):
        seconds, manager = record_agentrl(args)
        ours_record.append(seconds)
        seconds, samples = timed(partial(manager.get_trajectory, "s"))
        ours_get.append(seconds)
        assert len(samples) == 1 and samples[0].metadata["trained_turns"][-1] == args.turns
        seconds, baseline = record_baseline(args)
        base_record.append(seconds)
        seconds, base_samples = timed(baseline.get_trajectory)
        base_get.append(seconds)
        assert list(samples[0].tokens) == base_samples[0][0]
        assert list(samples[0].loss_mask) == base_samples[0][2]
        del manager, samples, baseline, base_samples
        gc.collect()

    rows = [
        ("bytes held after recording", ours_bytes, base_bytes, _mib),
        ("record_turn, all turns (s)", min(ours_record), min(base_record), _sec),
        ("get_trajectory (s)", min(ours_get), min(base_get), _sec),
    ]
    print(
        f"session: {args.turns} turns, prompt {args.first_prompt} -> {stats.last_prompt_tokens} "
        f"tokens, {stats.sampled_tokens} sampled tokens; python {sys.version.split()[0]}"
    )
    print(f"{'metric':<30}{'agentrl':>14}{'baseline':>14}{'agentrl/baseline':>18}")
    for name, ours, base, fmt in rows:
        print(f"{name:<30}{fmt(ours):>14}{fmt(base):>14}{ours / base:>18.4f}")
    print(f"record_turn per turn (agentrl): {1000 * min(ours_record) / args.turns:.2f} ms")
    print(f"baseline/agentrl bytes held: {base_bytes / ours_bytes:.1f}x less memory")
    print(f"session_stats().held_bytes: {_mib(stats.held_bytes)}")
    within = ours_bytes <= LIMIT_BYTES
    print(f"limit {_mib(LIMIT_BYTES)}: {'ok' if within else 'EXCEEDED'}")
    return 0 if within else 1


def _mib(value: float) -> str:
    return f"{value / 2**20:.2f} MiB"


def _sec(value: float) -> str:
    return f"{value:.3f}"


if __name__ == "__main__":
    raise SystemExit(main())
