#!/usr/bin/env python3
"""Stream a generation to stdout as it is produced; Ctrl-C cancels it in the daemon.

    python3 stream.py MODEL "PROMPT" [MAX_TOKENS]
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
            print(prompt, end="", flush=True)
            with c.generate(model, prompt, max_tokens=max_tokens, stream=True) as stream:
                for chunk in stream:
                    print(chunk.text, end="", flush=True)
            print()
            if stream.done is not None:
                print(f"[{stream.done.stop_reason}]", file=sys.stderr)
    except KeyboardInterrupt:  # leaving the with block on an exception cancels the generation
        print("\n[interrupted]", file=sys.stderr)
        return 130
    except CorralError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
