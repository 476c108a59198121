#!/usr/bin/env python3
"""A terminal chat: each turn is sent with the whole conversation, in one daemon session so that
only the new turn is run through the model.

    python3 chat.py MODEL ["SYSTEM PROMPT"]

An empty line or Ctrl-D ends the chat.
"""

import sys
import uuid

from corral import Client, CorralError


def main() -> int:
    if not 2 <= len(sys.argv) <= 3:
        print(__doc__.strip().splitlines()[3].strip(), file=sys.stderr)
        return 2
    model = sys.argv[1]
    messages = [{"role": "system", "content": sys.argv[2]}] if len(sys.argv) == 3 else []
    session = f"chat-{uuid.uuid4().hex[:8]}"
    with Client() as c:
        while True:
            try:
                line = input("> ").strip()
            except EOFError:
                break
            if not line:
                break
            messages.append({"role": "user", "content": line})
            try:
                result = c.chat(model, messages, session=session, max_tokens=256, return_done=True)
            except CorralError as e:
                print(f"error: {e}", file=sys.stderr)
                messages.pop()
                continue
            print(result.text.strip())
            messages.append({"role": "assistant", "content": result.text})
            d = result.done
            print(f"  [{d.prefilled_tokens} of {d.prompt_tokens} prompt tokens run]",
                  file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
