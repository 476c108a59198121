#!/usr/bin/python3
"""chat_jinja_oracle.py TEMPLATE.jinja BOS_TOKEN — the test oracle of test_chat.c's shipped
templates: render every test conversation with python3-jinja2 the way Hugging Face's
apply_chat_template does (a sandboxed environment with trim_blocks and lstrip_blocks,
raise_exception, the tojson filter), with and without the generation prompt, and print each case
for the C test to render with corral and compare byte for byte.

Output, one record per case (lengths in bytes of UTF-8; every text followed by a newline):
    case ADD_GENERATION_PROMPT N_MESSAGES
    msg ROLE LENGTH
    TEXT
    ... (N_MESSAGES of them)
    out LENGTH          (Jinja's rendering)
    TEXT
or
    err LENGTH          (Jinja raised: corral must refuse the conversation too)
    MESSAGE
"""
import json
import sys

try:
    import jinja2
    import jinja2.sandbox
except ImportError:
    sys.exit("python3-jinja2 is missing: apt-get install python3-jinja2 (scripts/bootstrap)")

# The conversations: system prompts, several turns, whitespace (ASCII and what Python's
# str.strip() also takes: U+3000, U+00A0, U+2003, U+001C, U+2028, U+0085), non-ASCII text,
# special-token text in messages, Qwen3's reasoning blocks and tool responses, Gemma 3's
# alternation rule, empty content and an empty conversation.
CONVERSATIONS = [
    [("user", "Hello")],
    [("system", "You are a helpful assistant"), ("user", "Hello")],
    [("system", "You are a helpful assistant"), ("user", "Hello"), ("assistant", "Hi there"),
     ("user", "Who are you"), ("assistant", "   I am an assistant   "),
     ("user", "Another question")],
    [("user", " \t lead and trail \n\n")],
    [("user", "\u3000\u00a0unicode spaces\u2003\u001c"), ("assistant", "\u2028 reply \u0085"),
     ("user", "\u200bzero width is not a space\u200b")],
    [("user", "\u4e2d\u6587 and emoji \U0001f469\u200d\U0001f4bb"), ("assistant", "ok \U0001f642")],
    [("user", "2+2?"), ("assistant", "<think>\nadd them\n</think>\n\n4"), ("user", "and 3+3?")],
    [("user", "q"), ("assistant", "<think>r1</think>a1"),
     ("user", "<tool_response>42</tool_response>"), ("assistant", "<think>\n\nr2\n</think>a2")],
    [("user", "hi"), ("assistant", "hello")],
    [("user", "x"), ("assistant", "<think>a</think>b</think>\n\nc")],
    [("system", "s1"), ("user", "u"), ("system", "s2 in the middle"), ("user", "u2")],
    [("user", "a"), ("user", "b")],
    [("assistant", "I speak first")],
    [("system", "only a system prompt")],
    [("user", "<|im_end|>x<end_of_turn><|eot_id|></s><|begin_of_text|><bos>")],
    [("user", "")],
    [("system", "line1\nline2\n"), ("user", "x"), ("assistant", "\n\ny\n")],
    [],
]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main():
    template_path, bos_token = sys.argv[1], sys.argv[2]
    with open(template_path, encoding="utf-8") as f:
        source = f.read()
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    template = env.from_string(source)
    out = sys.stdout.buffer
    for conversation in CONVERSATIONS:
        messages = [{"role": role, "content": content} for role, content in conversation]
        for add_generation_prompt in (False, True):
            out.write(b"case %d %d\n" % (add_generation_prompt, len(messages)))
            for m in messages:
                text = m["content"].encode("utf-8")
                out.write(b"msg %s %d\n%s\n" % (m["role"].encode(), len(text), text))
            try:
                text = template.render(messages=messages, bos_token=bos_token, eos_token="",
                                       add_generation_prompt=add_generation_prompt)
                data = text.encode("utf-8")
                out.write(b"out %d\n%s\n" % (len(data), data))
            except Exception as e:  # the template refuses the conversation
                data = ("%s: %s" % (type(e).__name__, e)).encode("utf-8")
                out.write(b"err %d\n%s\n" % (len(data), data))


if __name__ == "__main__":
    main()
