"""Logprobs in the two OpenAI shapes: the legacy completions object and chat's `content`.

A logprob entry, as the output processor keeps it, is {token id: logprob} holding the chosen
token and the top N; None for a position that has none (the first prompt token).
"""

from __future__ import annotations


class LogprobsFormatter:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def token_str(self, tid: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{tid}"
        return self.tokenizer.decode([tid])

    def completion(
        self,
        token_ids: list[int],
        logprobs: list[dict[int, float] | None] | None,
        k: int | None,
        text_offset: int = 0,
    ) -> dict:
        """{"tokens", "token_logprobs", "top_logprobs", "text_offset"} for these tokens;
        offsets count from `text_offset` characters (what came before in the choice)."""
        tokens, token_lps, tops = [], [], []
        for tid, lps in zip(token_ids, logprobs or []):
            tokens.append(self.token_str(tid))
            if lps is None:  # the first prompt token: nothing before it to predict it
                token_lps.append(None)
                tops.append(None)
                continue
            token_lps.append(lps.get(tid))
            ranked = sorted(lps.items(), key=lambda kv: -kv[1])[: max(k, 0)] if k else []
            tops.append({self.token_str(t): v for t, v in ranked} if k else None)
        offsets, pos = [], text_offset
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        return {
            "tokens": tokens,
            "token_logprobs": token_lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def chat(self, token_ids: list[int], logprobs, k: int | None) -> list[dict]:
        content = []
        for tid, lps in zip(token_ids, logprobs or []):
            tok = self.token_str(tid)
            ranked = sorted(lps.items(), key=lambda kv: -kv[1])[: k or 0]
            content.append(
                {
                    "token": tok,
                    "logprob": lps.get(tid),
                    "bytes": list(tok.encode()),
                    "top_logprobs": [
                        {
                            "token": self.token_str(t),
                            "logprob": v,
                            "bytes": list(self.token_str(t).encode()),
                        }
                        for t, v in ranked
                    ],
                }
            )
        return content


def join_completion_logprobs(first: dict, second: dict) -> dict:
    """The prompt's logprobs object followed by the output's (echo with logprobs)."""
    return {key: first[key] + second[key] for key in first}
