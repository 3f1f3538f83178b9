#!/usr/bin/env python3
"""Structured output and tools over real HTTP with the pinned `openai` client.

1. response_format json_schema: 100 sampled chat requests at temperature 1 on a random-weight
   fixture, and 30 completions on stories260K, all validating against the schema (jsonschema);
   json_object, guided_json/regex/choice/grammar, llama.cpp's grammar/json_schema fields.
2. 400s naming the unsupported schema feature / field.
3. Tools in each family's syntax — a Qwen2.5-tokenizer fixture (Hermes <tool_call>), a Llama 3
   tokenizer fixture with --chat-template llama3, the tiny fixture with --chat-template mistral:
   tool_choice named/required give tool_calls whose arguments validate against the function's
   parameters (Mistral ids: 9 letters and digits), streamed as delta.tool_calls with
   finish_reason "tool_calls"; the follow-up turn with role "tool" messages renders; auto works.
Exit 77 (skip) when openai or jsonschema is missing, unless KVBOOST_REQUIRE_ORACLES=1.
"""
import argparse
import concurrent.futures
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvboost_server import Checks, Server, fixture_model, require  # noqa: E402


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
        "score": {"anyOf": [{"type": "null"}, {"type": "integer", "minimum": -5, "maximum": 5}]},
        "ref": {"$ref": "#/$defs/point"},
    },
    "required": ["name", "age", "member", "tags", "ref"],
    "additionalProperties": False,
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                                           "y": {"type": "integer", "minimum": 0, "maximum": 9}},
                        "required": ["x", "y"], "additionalProperties": False}},
}

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 10},
                                                    "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
                                       "required": ["zone"]}}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvboost", required=True)
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--shared", required=True)
    a = ap.parse_args()
    jsonschema, openai = require("jsonschema", "openai")
    tiny = fixture_model(a.fixture, a.workdir, "tiny")
    qwen_tok = os.path.join(a.shared, "tokenizers", "qwen2.5")
    qwen = os.path.join(a.workdir, "qwen-tools")
    if os.path.exists(os.path.join(qwen_tok, "tokenizer.json")):
        fixture_model(a.fixture, a.workdir, "qwen-tools", "--tokenizer", qwen_tok, "--hidden", "32", "--intermediate",
                      "64", "--layers", "1", "--heads", "4", "--kv-heads", "2")
    stories = os.path.join(a.shared, "models", "stories260K")

    check = Checks()

    def valid(doc, schema):
        try:
            jsonschema.validate(json.loads(doc), schema)
            return True
        except Exception as e:  # noqa: BLE001 (json or schema error: reported below)
            print(f"     invalid: {e.__class__.__name__}: {str(e)[:200]}\n     doc: {doc[:300]!r}")
            return False

    servers = []

    def start(model, name, *extra):
        srv = Server(a.kvboost, model, name, *extra, max_batch=8)
        servers.append(srv)
        return srv, srv.port
    try:
        # ---- 1. json_schema on the random fixture (chat) and stories260K (completions) ----
        proc, port = start(tiny, "tiny")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
        rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
        results = [None] * 100

        def one(i):
            r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"person {i}"}],
                                               temperature=1.0, seed=i, max_tokens=400, response_format=rf)
            results[i] = r

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:  # within max_batch + max_queue
            list(ex.map(one, range(100)))
        n_valid = sum(1 for r in results if r is not None and valid(r.choices[0].message.content, SCHEMA))
        check(n_valid == 100, f"fixture: 100/100 sampled json_schema outputs validate (got {n_valid})")
        check(all(r is not None and r.choices[0].finish_reason == "stop" for r in results), "fixture: all finish 'stop'")
        distinct = len({r.choices[0].message.content for r in results if r is not None})
        check(distinct > 50, f"fixture: outputs are sampled, not one fixed string ({distinct} distinct)")

        # Streaming joins to a valid document too.
        text = ""
        for ch in client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "s"}], stream=True,
                                                 temperature=1.0, seed=7, max_tokens=400, response_format=rf):
            if ch.choices and ch.choices[0].delta.content:
                text += ch.choices[0].delta.content
        check(valid(text, SCHEMA), "fixture: streamed json_schema output validates")

        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "j"}], temperature=1.0,
                                           seed=3, max_tokens=300, response_format={"type": "json_object"})
        c = r.choices[0]
        ok = c.finish_reason == "length" or isinstance(json.loads(c.message.content), dict)
        check(ok, f"json_object: an object (or cut by max_tokens): {c.message.content[:80]!r}")

        def comp(**extra):
            return client.completions.create(model="tiny", prompt="x", max_tokens=64, temperature=1.0, seed=5,
                                             extra_body=extra).choices[0].text

        check(comp(guided_choice=["alpha", "beta"]) in ("alpha", "beta"), "guided_choice")
        check(re.fullmatch(r"[0-9]{3}-[a-z]{2}", comp(guided_regex="[0-9]{3}-[a-z]{2}")) is not None, "guided_regex")
        check(comp(grammar='root ::= "a" [bc]{2}') in ("abb", "abc", "acb", "acc"), "llama.cpp grammar (GBNF)")
        check(comp(guided_grammar='root ::= ("x" | "y")+ "."')[-1:] == ".", "guided_grammar")
        small = {"type": "object", "properties": {"k": {"enum": [1, 2]}}, "required": ["k"]}
        check(valid(comp(guided_json=small), small), "guided_json")
        check(valid(comp(json_schema=small), small), "llama.cpp json_schema")

        # ---- 2. errors ----
        def status_of(fn):
            try:
                fn()
                return 200, ""
            except openai.APIStatusError as e:
                return e.status_code, str(e)

        bad = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
        st, msg = status_of(lambda: client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {"name": "b", "schema": bad}}))
        check(st == 400 and "uniqueItems" in msg, f"unsupported schema feature: 400 naming it ({st} {msg[:120]})")
        st, msg = status_of(lambda: comp(guided_whitespace_pattern=" *"))
        check(st == 400 and "guided_whitespace_pattern" in msg, "guided_whitespace_pattern: 400")
        st, msg = status_of(lambda: comp(grammar="root ::= foo"))
        check(st == 400 and "undefined rule 'foo'" in msg and "1:10" in msg, f"bad GBNF: 400 with line:col ({msg[:120]})")
        st, msg = status_of(lambda: comp(guided_regex="(a)\\1"))
        check(st == 400 and "backreference" in msg, "regex backreference: 400")
        st, msg = status_of(lambda: comp(guided_choice=["a"], guided_regex="a"))
        check(st == 400, "two constraints at once: 400")
        st, msg = status_of(lambda: client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], tools=[WEATHER]))
        check(st == 400 and "does not render tools" in msg, f"tools on a template without tools: 400 ({msg[:100]})")
        proc.stop()

        # ---- stories260K (completions) ----
        if os.path.exists(os.path.join(stories, "model.safetensors")):
            proc, port = start(stories, "stories")
            sc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
            res = [None] * 30

            def one_s(i):
                res[i] = sc.completions.create(model="stories", prompt="Once upon a time", max_tokens=400, temperature=1.0,
                                               seed=i, extra_body={"response_format": rf}).choices[0].text

            with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
                list(ex.map(one_s, range(30)))
            nv = sum(1 for t in res if t is not None and valid(t, SCHEMA))
            check(nv == 30, f"stories260K: 30/30 sampled json_schema outputs validate (got {nv})")
            proc.stop()

        # ---- 3. tools, in each family's syntax ----
        def id_ok(family, cid):
            return (len(cid) == 9 and cid.isalnum()) if family == "mistral" else cid.startswith("call_")

        def tools_suite(name, port, family):
            qc = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
            markers = {"hermes": "<tool_call>", "llama3": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}
            msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
            for i in range(5):
                r = qc.chat.completions.create(model=name, messages=msgs, tools=[WEATHER, TIME], temperature=1.0, seed=i,
                                               max_tokens=300,
                                               tool_choice={"type": "function", "function": {"name": "get_weather"}})
                c = r.choices[0]
                calls = c.message.tool_calls or []
                ok = (c.finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "get_weather"
                      and id_ok(family, calls[0].id) and calls[0].type == "function"
                      and valid(calls[0].function.arguments, WEATHER["function"]["parameters"]))
                check(ok, f"{family}: named tool_choice {i}: one valid get_weather call ({c.finish_reason}, {calls})")
            for i in range(5):
                r = qc.chat.completions.create(model=name, messages=msgs, tools=[WEATHER, TIME], temperature=1.0,
                                               seed=10 + i, max_tokens=300, tool_choice="required")
                calls = r.choices[0].message.tool_calls or []
                fn = {"get_weather": WEATHER, "get_time": TIME}.get(calls[0].function.name if calls else "")
                check(fn is not None and valid(calls[0].function.arguments, fn["function"]["parameters"])
                      and id_ok(family, calls[0].id), f"{family}: required tool_choice {i}: a valid call ({calls})")
            # Streaming: delta.tool_calls, finish_reason tool_calls.
            deltas, finish, content = [], None, ""
            for ch in qc.chat.completions.create(model=name, messages=msgs, tools=[WEATHER], stream=True, temperature=1.0,
                                                 seed=3, max_tokens=300, tool_choice="required"):
                if not ch.choices:
                    continue
                d = ch.choices[0].delta
                if d.tool_calls:
                    deltas.extend(d.tool_calls)
                if d.content:
                    content += d.content
                if ch.choices[0].finish_reason:
                    finish = ch.choices[0].finish_reason
            args = "".join(t.function.arguments or "" for t in deltas)
            check(finish == "tool_calls" and deltas and deltas[0].function.name == "get_weather" and deltas[0].index == 0
                  and id_ok(family, deltas[0].id) and valid(args, WEATHER["function"]["parameters"])
                  and markers[family] not in content and "get_weather" not in content,
                  f"{family}: streamed tool call: delta.tool_calls + finish tool_calls ({finish}, {deltas}, {content!r})")
            # Follow-up turn: the assistant's call and the tool's answer render.
            call = r.choices[0].message.tool_calls[0]
            follow = msgs + [
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": call.id, "type": "function",
                                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
                {"role": "tool", "tool_call_id": call.id, "content": "{\"temp\": 21}"}]
            r2 = qc.chat.completions.create(model=name, messages=follow, tools=[WEATHER, TIME], max_tokens=8,
                                            temperature=0, tool_choice="none")
            check(r2.choices[0].message.content is not None and r2.usage.prompt_tokens > 40,
                  f"{family}: follow-up turn with a role 'tool' message renders ({r2.usage.prompt_tokens} prompt tokens)")
            r3 = qc.chat.completions.create(model=name, messages=msgs, tools=[WEATHER], max_tokens=16, temperature=1.0,
                                            seed=1)
            check(r3.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"{family}: tool_choice auto: 200")
            st, msg = status_of(lambda: qc.chat.completions.create(
                model=name, messages=msgs, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}))
            check(st == 400 and "nope" in msg, f"{family}: named tool not in tools: 400")

        # Qwen2.5 (Hermes <tool_call>), its own template.
        if os.path.exists(os.path.join(qwen, "model.safetensors")):
            proc, port = start(qwen, "qwen")
            tools_suite("qwen", port, "hermes")
            proc.stop()
        else:
            check(False, "qwen2.5 tokenizer missing for the tools fixture")
        # Llama 3.x JSON calls: the real Llama 3 tokenizer, --chat-template llama3.
        llama_tok = os.path.join(a.shared, "tokenizers", "llama3")
        if os.path.exists(os.path.join(llama_tok, "tokenizer.json")):
            llama = fixture_model(a.fixture, a.workdir, "llama3-tools", "--tokenizer", llama_tok, "--hidden", "32",
                                  "--intermediate", "64", "--layers", "1", "--heads", "4", "--kv-heads", "2")
            proc, port = start(llama, "llama3", "--chat-template", "llama3")
            tools_suite("llama3", port, "llama3")
            proc.stop()
        else:
            check(False, "llama3 tokenizer missing for the tools fixture")
        # Mistral [TOOL_CALLS] with 9-character ids: --chat-template mistral on the tiny fixture.
        proc, port = start(tiny, "mistral", "--chat-template", "mistral")
        tools_suite("mistral", port, "mistral")
        proc.stop()
    finally:
        for srv in servers:
            srv.stop()
    print(f"{len(check.failures)} failure(s)")
    return check.result(servers[-1].log if servers else ())


if __name__ == "__main__":
    sys.exit(main())
