#!/usr/bin/env python3
"""Several generations at once on one asyncio client, then one streamed.

    python3 async_generate.py MODEL "PROMPT" ["PROMPT" ...]
"""

import asyncio
import sys

from corral import AsyncClient, CorralError


async def run(model: str, prompts: list[str]) -> None:
    async with AsyncClient() as c:
        # All in flight together; the daemon interleaves them token by token.
        texts = await asyncio.gather(*(c.generate(model, p, max_tokens=48) for p in prompts))
        for prompt, text in zip(prompts, texts):
            print(f"--- {prompt!r}\n{prompt}{text}\n")
        stream = await c.generate(model, prompts[0], max_tokens=48, stream=True)
        async with stream:
            async for chunk in stream:
                print(chunk.text, end="", flush=True)
        print(f"\n[{stream.done.stop_reason if stream.done else 'no Done'}]")


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        asyncio.run(run(sys.argv[1], sys.argv[2:]))
    except CorralError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
