"""`cadence chat`: a small terminal client for a running server, streaming the replies."""

from __future__ import annotations

import argparse
import json
import os
import sys


def add_chat_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default="http://127.0.0.1:8000", help="the server (default: http://127.0.0.1:8000)"
    )
    parser.add_argument("--model", default=None, help="model name (default: the server's first)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("CADENCE_API_KEY"),
        help="bearer key, if the server wants one",
    )
    parser.add_argument("--system", default=None, help="a system message")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.7)


def run_chat(args: argparse.Namespace) -> int:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = args.url.rstrip("/")
    with httpx.Client(
        base_url=base, headers=headers, timeout=httpx.Timeout(600, connect=5)
    ) as http:
        try:
            model = args.model or http.get("/v1/models").json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, json.JSONDecodeError) as e:
            print(f"cadence chat: cannot reach a server at {base}: {e}", file=sys.stderr)
            return 1
        messages = [{"role": "system", "content": args.system}] if args.system else []
        print(f"chatting with {model} at {base}; an empty line or Ctrl-D quits", file=sys.stderr)
        while True:
            try:
                line = input("> ").strip()
            except (EOFError, KeyboardInterrupt):
                print(file=sys.stderr)
                return 0
            if not line:
                return 0
            messages.append({"role": "user", "content": line})
            body = {
                "model": model,
                "messages": messages,
                "stream": True,
                "max_tokens": args.max_tokens,
                "temperature": args.temperature,
            }
            reply = []
            try:
                with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                    if resp.status_code != 200:
                        resp.read()
                        print(f"error {resp.status_code}: {resp.text}", file=sys.stderr)
                        messages.pop()
                        continue
                    for raw in resp.iter_lines():
                        if not raw.startswith("data: ") or raw == "data: [DONE]":
                            continue
                        chunk = json.loads(raw[6:])
                        if "error" in chunk:
                            print(f"\nerror: {chunk['error']['message']}", file=sys.stderr)
                            break
                        for choice in chunk.get("choices", []):
                            piece = choice.get("delta", {}).get("content") or ""
                            reply.append(piece)
                            print(piece, end="", flush=True)
            except KeyboardInterrupt:
                print(" [interrupted]", file=sys.stderr)
            except httpx.HTTPError as e:
                print(f"\nconnection error: {e}", file=sys.stderr)
            print()
            messages.append({"role": "assistant", "content": "".join(reply)})
