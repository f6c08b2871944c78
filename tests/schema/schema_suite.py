#!/usr/bin/env python3
"""The tool-schema suite: a few hundred valid JSON Schemas of the kinds agents send, each the
parameters of a forced tool call on the random-weight tiny model, asked whole and streamed; every
call's arguments are checked by an independent validator (python3-jsonschema, Draft 2020-12).
A schema either gives 100 % valid calls, or the request is refused with a 400 whose message names
the keyword (`--expect-400` lists the keywords the server may refuse).

usage: schema_suite.py <kimi binary> [--count N] [--seed S] [--model GGUF] [--keep]
Exit 0: all good; 1: a failure (printed); 77: skipped (python3-jsonschema missing, unless
KIMI_REQUIRE_SCHEMA_SUITE=1 or CI=true, where it fails).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

try:
    import jsonschema
except ImportError:  # pragma: no cover
    if os.environ.get("KIMI_REQUIRE_SCHEMA_SUITE") == "1" or os.environ.get("CI") == "true":
        print("FAIL: python3-jsonschema is not installed (scripts/setup.sh --test installs it)")
        sys.exit(1)
    print("SKIP: python3-jsonschema is not installed (scripts/setup.sh --test)")
    sys.exit(77)

# Keywords the server may refuse with a 400 naming them (none of the generator's: every schema here
# must be enforced).
REFUSABLE = set()


# ---------------------------------------------------------------------------------------------
# The seeded generator: schemas of the kinds agents send

WORDS = ["path", "query", "limit", "mode", "name", "id", "tags", "options", "url", "count", "level", "kind",
         "start", "end", "text", "lang", "user", "flags", "depth", "score", "note", "items", "meta", "format"]
PATTERNS = [r"^[a-z]+$", r"^[A-Z][a-z]{1,8}$", r"^\d{3}-\d{4}$", r"^[a-z0-9_-]{1,16}$", r"^(get|set|del)$",
            r"^#[0-9a-fA-F]{6}$", r"^v\d+\.\d+\.\d+$", r"^\w+@\w+\.(com|org)$", r"^[^\s]{1,10}$", r"ab+c",
            r"^\S+$", r"^[A-Z]{2,3}$", r"^(yes|no)?$", r"x[0-9]?y"]


class Gen:
    def __init__(self, rnd):
        self.r = rnd

    def name(self, used):
        while True:
            w = self.r.choice(WORDS) + (self.r.choice(["", "", "_" + self.r.choice(WORDS)]))
            if w not in used:
                used.add(w)
                return w

    def string(self):
        k = self.r.randrange(6)
        s = {"type": "string"}
        if k == 0:
            s["maxLength"] = self.r.choice([1, 4, 8, 20, 64, 100, 200])
        elif k == 1:
            lo = self.r.randrange(0, 4)
            s["minLength"], s["maxLength"] = lo, lo + self.r.randrange(0, 12)
        elif k == 2:
            s["pattern"] = self.r.choice(PATTERNS)
        elif k == 3:
            s["enum"] = self.r.sample(["a", "b", "read", "write", "x<y", "caf\u00e9", "q\"t"], self.r.randrange(1, 4))
        if self.r.random() < 0.3:
            s["description"] = "a " + self.r.choice(WORDS)
        return s

    def integer(self):
        s = {"type": self.r.choice(["integer", "integer", "number"])}
        k = self.r.randrange(5)
        if k == 0:
            s["minimum"] = self.r.randrange(-50, 50)
        elif k == 1:
            s["maximum"] = self.r.randrange(-50, 5000)
        elif k == 2:
            lo = self.r.randrange(-1000, 1000)
            s["minimum"], s["maximum"] = lo, lo + self.r.randrange(0, 3000)
        elif k == 3:
            lo = self.r.randrange(-20, 20)
            s["exclusiveMinimum"], s["exclusiveMaximum"] = lo, lo + self.r.randrange(2, 200)
        return s

    def scalar(self):
        k = self.r.randrange(7)
        if k <= 2:
            return self.string()
        if k <= 4:
            return self.integer()
        if k == 5:
            return {"type": "boolean"}
        return {"type": self.r.choice([["string", "null"], ["integer", "null"], ["boolean"], ["string"]])}

    def value(self, depth):
        k = self.r.randrange(10)
        if depth <= 0 or k < 5:
            return self.scalar()
        if k < 7:
            return self.obj(depth - 1, self.r.randrange(1, 5))
        if k < 9:
            a = {"type": self.r.choice(["array", ["array"]]), "items": self.value(depth - 1)}
            if self.r.random() < 0.6:
                lo = self.r.randrange(0, 3)
                a["minItems"] = lo
                a["maxItems"] = lo + self.r.randrange(0, 4)
            return a
        return {"anyOf": [self.scalar(), {"type": "null"}]}

    def obj(self, depth, n, top=False):
        used = set()
        props = {self.name(used): self.value(depth) for _ in range(n)}
        s = {"type": "object" if self.r.random() < 0.7 or top else ["object"], "properties": props}
        req = [k for k in props if self.r.random() < 0.5]
        if req:
            s["required"] = req
        if self.r.random() < 0.5:
            s["additionalProperties"] = False
        return s

    # the shapes the issue names, each a family
    def family(self, i):
        f = i % 10
        r = self.r
        if f == 0:  # one-element and multi-element type lists
            t = r.choice([["object"], ["array"], ["string"]])
            inner = {"type": t}
            if t == ["object"]:
                inner.update({"properties": {"id": {"type": "string", "maxLength": 6}}, "required": ["id"],
                              "additionalProperties": False})
            elif t == ["array"]:
                inner.update({"items": {"type": ["integer"], "minimum": 0, "maximum": 9}, "maxItems": 3})
            else:
                inner.update({"maxLength": r.choice([2, 5, 9])})
            return {"type": "object", "properties": {"value": inner}, "required": ["value"], "additionalProperties": False}
        if f == 1:  # $ref into $defs, JSON-pointer paths
            d = {"p": self.obj(1, 3), "q": self.scalar()}
            key = next(iter(d["p"]["properties"]))
            return {"type": "object", "$defs": d,
                    "properties": {"a": {"$ref": "#/$defs/p"}, "b": {"$ref": "#/$defs/q"},
                                   "c": {"$ref": f"#/$defs/p/properties/{key}"}},
                    "required": r.sample(["a", "b", "c"], r.randrange(1, 4))}
        if f == 2:  # nested optional objects (6 x 6 in the issue)
            n, m = r.randrange(3, 7), r.randrange(3, 7)
            used = set()
            props = {}
            for _ in range(n):
                inner_used = set()
                props[self.name(used)] = {"type": "object",
                                          "properties": {self.name(inner_used): {"type": "string", "maxLength": 12}
                                                         for _ in range(m)}}
            return {"type": "object", "properties": props}
        if f == 3:  # additionalProperties without properties, false or a schema
            ap = r.choice([False, {"type": "integer", "minimum": 0, "maximum": 99}, {"type": "string", "maxLength": 5},
                           {"type": "boolean"}])
            inner = {"type": "object", "additionalProperties": ap}
            s = {"type": "object", "properties": {"map": inner}, "required": ["map"]}
            if r.random() < 0.5:
                s["properties"]["id"] = {"type": "integer", "minimum": 1}
                s["additionalProperties"] = {"type": "string", "maxLength": 4}
            return s
        if f == 4:  # ranges
            used = set()
            return {"type": "object", "properties": {self.name(used): self.integer() for _ in range(r.randrange(1, 4))},
                    "additionalProperties": False}
        if f == 5:  # patterns
            used = set()
            props = {self.name(used): {"type": "string", "pattern": r.choice(PATTERNS)} for _ in range(r.randrange(1, 3))}
            return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
        if f == 6:  # lengths, some above 64
            used = set()
            props = {}
            for _ in range(r.randrange(1, 3)):
                lo = r.randrange(0, 3)
                props[self.name(used)] = {"type": "string", "minLength": lo, "maxLength": lo + r.choice([3, 65, 120, 300])}
            props["list"] = {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": r.randrange(0, 2),
                             "maxItems": r.choice([2, 5, 8])}
            return {"type": "object", "properties": props, "required": list(props)}
        if f == 7:  # enums and consts
            return {"type": "object", "properties": {
                "mode": {"enum": r.sample(["fast", "slow", "auto", 1, 2.5, None, True], r.randrange(1, 5))},
                "fixed": {"const": r.choice(["v1", 3, False, {"k": [1, 2]}])},
                "level": {"type": "string", "enum": ["low", "high"]}}, "required": ["mode", "fixed"]}
        if f == 8:  # anyOf / oneOf with disjoint types
            return {"type": "object", "properties": {
                "target": {"anyOf": [{"type": "string", "maxLength": 10}, {"type": "integer", "minimum": 0},
                                     {"type": "null"}]},
                "shape": {"oneOf": [{"type": "object", "properties": {"r": {"type": "number", "minimum": 0, "maximum": 10}},
                                     "required": ["r"], "additionalProperties": False},
                                    {"type": "array", "items": {"type": "integer"}, "maxItems": 2}]}},
                "required": ["target"]}
        return self.obj(2, r.randrange(1, 6), top=True)  # a mixed tree


def suite(count, seed):
    g = Gen(random.Random(seed))
    out = []
    for i in range(count):
        s = g.family(i)
        jsonschema.Draft202012Validator.check_schema(s)  # the generator writes valid schemas only
        out.append(s)
    return out


# ---------------------------------------------------------------------------------------------
# The server

def start_server(kimi, model):
    p = subprocess.Popen([kimi, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-c", "4096",
                          "--parallel", "4", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    port = []

    def read():
        for line in p.stdout:
            m = re.search(r"listening on http://[^:]+:(\d+)", line)
            if m and not port:
                port.append(int(m.group(1)))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    while not port:  # waits for the line (or the process ending)
        if p.poll() is not None:
            raise RuntimeError("kimi serve exited: " + p.stderr.read())
        t.join(0.05)
    return p, port[0]


def post(port, body, stream):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def calls_of(status, text, stream):
    """(finish_reason, [arguments strings])"""
    if not stream:
        j = json.loads(text)
        c = j["choices"][0]
        return c["finish_reason"], [tc["function"]["arguments"] for tc in (c["message"].get("tool_calls") or [])]
    args, finish = {}, None
    for line in text.split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if "error" in ev:
            return "error: " + json.dumps(ev["error"]), []
        for ch in ev.get("choices", []):
            for tc in ch.get("delta", {}).get("tool_calls") or []:
                args.setdefault(tc["index"], "")
                args[tc["index"]] += tc.get("function", {}).get("arguments", "")
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    return finish, [args[k] for k in sorted(args)]


def run_one(port, i, schema, stream, thinking):
    body = {"messages": [{"role": "user", "content": f"Call the tool (case {i})."}],
            "tools": [{"type": "function", "function": {"name": "tool", "description": "a tool", "parameters": schema}}],
            "tool_choice": {"type": "function", "function": {"name": "tool"}},
            "max_tokens": 160, "seed": 1000 + i, "thinking": thinking, "stream": stream}
    status, text = post(port, body, stream)
    where = f"schema {i} ({'streamed' if stream else 'whole'}, thinking {thinking})"
    if status == 400:
        msg = json.loads(text)["error"]["message"]
        if not any(k in msg for k in REFUSABLE):
            return f"{where}: refused with a 400 that names no refusable keyword: {msg}\n  schema: {json.dumps(schema)}"
        return None
    if status != 200:
        return f"{where}: HTTP {status}: {text[:300]}"
    finish, calls = calls_of(status, text, stream)
    if finish != "tool_calls" or len(calls) != 1:
        return f"{where}: finish {finish}, {len(calls)} calls: {text[:400]}\n  schema: {json.dumps(schema)}"
    try:
        args = json.loads(calls[0])
    except ValueError as e:
        return f"{where}: arguments are not JSON ({e}): {calls[0]!r}"
    errs = sorted(jsonschema.Draft202012Validator(schema).iter_errors(args), key=str)
    if errs:
        return f"{where}: invalid arguments {calls[0]}: {errs[0].message}\n  schema: {json.dumps(schema)}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kimi")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--model", default="")
    ap.add_argument("--jobs", type=int, default=4)
    a = ap.parse_args()
    schemas = suite(a.count, a.seed)
    tmp = tempfile.mkdtemp(prefix="kimi-schemas-")
    model = a.model
    if not model:
        hf, model = os.path.join(tmp, "hf"), os.path.join(tmp, "tiny.gguf")
        subprocess.run([a.kimi, "synth", "--preset", "tiny", "--seed", "3", "-o", hf], check=True, capture_output=True)
        subprocess.run([a.kimi, "convert", hf, "-o", model, "--quiet"], check=True, capture_output=True)
    server, port = start_server(a.kimi, model)
    t0 = time.time()
    failures = []
    try:
        jobs = []
        with ThreadPoolExecutor(a.jobs) as ex:
            for i, s in enumerate(schemas):
                # whole and streamed; thinking on for every third schema (the think channel is then free text)
                jobs.append(ex.submit(run_one, port, i, s, False, i % 3 == 0))
                jobs.append(ex.submit(run_one, port, i, s, True, i % 3 == 1))
            for j in jobs:
                r = j.result()
                if r:
                    failures.append(r)
    finally:
        server.terminate()
        server.wait(timeout=60)
    n = 2 * len(schemas)
    print(f"schema suite: {len(schemas)} schemas, {n} forced calls, {n - len(failures)} valid, "
          f"{len(failures)} failed, {time.time() - t0:.1f} s")
    for f in failures[:20]:
        print("FAIL: " + f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
