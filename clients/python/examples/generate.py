#!/usr/bin/env python3
"""Generate text with one call and print it, then how the generation ended.

    python3 generate.py MODEL "PROMPT" [MAX_TOKENS]

Connects to $CORRAL_ENDPOINT, else corrald's default endpoint.
"""

import sys

from corral import Client, CorralError


def main() -> int:
    if not 3 <= len(sys.argv) <= 4:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    model, prompt = sys.argv[1], sys.argv[2]
    max_tokens = int(sys.argv[3]) if len(sys.argv) == 4 else None
    try:
        with Client() as c:
            result = c.generate(model, prompt, max_tokens=max_tokens, return_done=True)
    except CorralError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(prompt + result.text)
    d = result.done
    print(
        f"[{d.stop_reason}: {d.prompt_tokens} prompt + {d.generated_tokens} generated tokens "
        f"in {d.timings.total_us / 1000:.1f} ms]",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
