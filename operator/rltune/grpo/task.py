"""The reference task: reverse a short digit sequence. Verifiable reward, tiny vocabulary.

Prompt   BOS d1 d2 .. dL SEP         (L uniform in [MIN_DIGITS, max_digits])
Response dL .. d2 d1 EOS
Reward   fraction of response positions that match the target (EOS included), divided by the
         longer of the two lengths, so extra or missing tokens cost: 1.0 only for an exact answer.

Token ids: 0 PAD, 1 BOS, 2 EOS, 3 SEP, 4..13 the digits 0..9. Any vocabulary of >= 14 works; the
ids above 13 are never targets, so the model must learn to avoid them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAD, BOS, EOS, SEP = 0, 1, 2, 3
DIGIT0 = 4
MIN_VOCAB = DIGIT0 + 10
MIN_DIGITS = 3
MAX_DIGITS = 6


@dataclass(frozen=True)
class ReverseTask:
    max_digits: int = MAX_DIGITS

    @classmethod
    def for_budget(cls, max_prompt_tokens: int, max_response_tokens: int) -> "ReverseTask":
        """The longest digit count (up to MAX_DIGITS) that fits the task's prompt/response budget."""
        d = min(MAX_DIGITS, max_prompt_tokens - 2, max_response_tokens - 1)
        if d < MIN_DIGITS:
            raise ValueError(
                f"real mode's reverse task needs maxPromptTokens >= {MIN_DIGITS + 2} and "
                f"maxResponseTokens >= {MIN_DIGITS + 1} (got {max_prompt_tokens}, {max_response_tokens})"
            )
        return cls(max_digits=d)

    @property
    def max_prompt_len(self) -> int:
        return self.max_digits + 2

    @property
    def max_response_len(self) -> int:
        return self.max_digits + 1

    def prompts(self, seed: int, step: int, count: int) -> list[list[int]]:
        """The step's prompts (deterministic in seed and step)."""
        rng = np.random.default_rng([seed, step, 7919])
        out = []
        for _ in range(count):
            n = int(rng.integers(MIN_DIGITS, self.max_digits + 1))
            digits = rng.integers(0, 10, size=n)
            out.append([BOS] + [DIGIT0 + int(d) for d in digits] + [SEP])
        return out

    @staticmethod
    def target(prompt: list[int]) -> list[int]:
        return list(reversed(prompt[1:-1])) + [EOS]

    @classmethod
    def reward(cls, prompt: list[int], response: list[int]) -> float:
        tgt = cls.target(prompt)
        hits = sum(1 for a, b in zip(response, tgt) if a == b)
        return hits / max(len(tgt), len(response), 1)

    def supervised_batch(
        self, rng: np.random.Generator, count: int, noise: float = 0.0
    ) -> list[tuple[list[int], list[int]]]:
        """(prompt, response) pairs for the supervised warm start; with `noise`, each response digit is
        replaced by a random digit with that probability (a weak, uncertain teacher)."""
        pairs = []
        for _ in range(count):
            n = int(rng.integers(MIN_DIGITS, self.max_digits + 1))
            p = [BOS] + [DIGIT0 + int(d) for d in rng.integers(0, 10, size=n)] + [SEP]
            r = self.target(p)
            if noise > 0:
                r = [DIGIT0 + int(rng.integers(0, 10)) if t != EOS and rng.random() < noise else t for t in r]
            pairs.append((p, r))
        return pairs
