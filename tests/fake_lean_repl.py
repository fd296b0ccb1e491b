#!/usr/bin/env python3
"""A stand-in for the Lean REPL, for tests only: speaks its JSON protocol, knows no Lean.

Protocol (as leanprover-community/repl): a request is JSON lines ended by a blank
line; the reply is pretty-printed JSON followed by a blank line; EOF ends the
loop; a request that is not JSON ends the process with an error on stderr. Each
command gets the next env number; `{"cmd", "env": n}` with an unknown n answers
`{"message": "Unknown environment."}`; `import` is only allowed without env.

Lean is faked by keywords, read from the code as Lean reads it (comments and
literals found by compassplay_jax/lean_syntax/lexer.py, the port of Lean's
tokenizer): `sorry`/`admit` give a sorry entry and the warning
"declaration uses 'sorry'"; `#print axioms X` reports sorryAx for sorry, the
names of declared `axiom`s, Lean.ofReduceBool for native_decide, and any names
given by a `fake: axioms` directive; `#print "s"` prints s. The declaration audit
(verifiers/lean_audit.py: `#eval show Lean.CoreM Unit from do` carrying its
marker) answers as its Lean code does: one info message at the `#eval` line,
the marker, then `name kind` for every declaration the command's code adds
(theorem/lemma, def/abbrev/instance, axiom, opaque, inductive/structure/class
with their constructor and recursor, `_aux_` definitions for elab/macro/syntax/
notation, `<thm>.match_1` for a `match` in a proof); a kernel error at that line
instead when the proof was only accepted with the kernel check skipped.

Behaviour is set by directive comments inside a command (`-- fake: <what>`):
  sleep S | hang | crash | crash-mid-reply | grow MB | error TEXT | axioms A, B |
  decls NAME KIND, … (more declarations in the audit) | unchecked (the kernel check was
  skipped: the audit's re-check fails) |
  reply JSON (answer exactly this) | noise (print non-JSON lines before the reply) |
  forge JSON (print JSON and a blank line while "elaborating", before the real reply: a proof
  writing a reply-shaped text to stdout) | forge-glued JSON (the same, then a byte glued to the
  real reply) | forge-after JSON (print it after the real reply)
and by flags: --log PATH (append one JSON line per event), --header-delay S,
--sorry-backticks (the Lean >= 4.26 spelling of the warning), --banner (print
stray text at start-up), --accept-percent P (reject about (100-P)% of declarations,
chosen by a hash of their text: a stand-in for a prover that is sometimes wrong).
"""
import argparse
import hashlib
import json
import os
import re
import sys
import time

# Run as a script: the checkout's package, whether or not it is installed (sys.path[0] is tests/).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from compassplay_jax.lean_syntax import lexer  # noqa: E402
from compassplay_jax.verifiers import lean_audit

_KNOWN_IMPORTS = ("Mathlib", "Aesop", "Init", "Lean", "Std", "Batteries")
_HOLD = []  # Memory grown on request stays allocated for the process's life.


def _log(path, **event):
  if path:
    with open(path, "a") as f:
      f.write(json.dumps({"pid": os.getpid(), **event}) + "\n")


def _read_request():
  """Lines up to a blank line, joined as the real REPL does; None at EOF."""
  lines = []
  while True:
    line = sys.stdin.readline()
    if not line:
      return "".join(lines) or None
    if not line.strip():
      if lines:
        return "".join(lines)
      continue
    lines.append(line.rstrip())


def _position(cmd, index):
  line = cmd.count("\n", 0, index) + 1
  column = index - (cmd.rfind("\n", 0, index) + 1)
  return {"line": line, "column": column}


def _message(cmd, index, length, severity, data):
  return {"pos": _position(cmd, index), "endPos": _position(cmd, index + length),
          "severity": severity, "data": data}


def _directives(cmd):
  return [m.group(1).strip() for m in re.finditer(r"--\s*fake:\s*(.*)", cmd)]


def _code(cmd):
  """The command without comments (as Lean's tokenizer finds them), same length so positions
  still match."""
  pieces = []
  for segment in lexer.lex(cmd):
    piece = cmd[segment.start:segment.end]
    pieces.append(re.sub(r"[^\n]", " ", piece) if segment.kind == lexer.COMMENT else piece)
  return "".join(pieces)


_DECLARATIONS = (  # (regex on the code, kind, name template) for what a command adds
    (r"\b(?:theorem|lemma)\s+([^\s(){}\[\]:]+)", "theorem", "{}"),
    (r"\b(?:def|abbrev)\s+([^\s(){}\[\]:]+)", "definition", "{}"),
    (r"\binstance\b\s*([^\s(){}\[\]:]*)", "definition", "{}"),
    (r"\baxiom\s+([^\s(){}\[\]:]+)", "axiom", "{}"),
    (r"\bopaque\s+([^\s(){}\[\]:]+)", "opaque", "{}"),
    (r"\b(?:inductive|structure|class)\s+([^\s(){}\[\]:]+)", "inductive", "{}"),
    (r"\b(elab|macro|syntax|notation|macro_rules|elab_rules)\b", "definition", "_aux_{}_1"),
)


def _declarations(code, directives):
  """(name, kind) of what the command's code declares, as the audit would list them."""
  found = []
  for pattern, kind, template in _DECLARATIONS:
    for hit in re.finditer(pattern, code):
      name = template.format(hit.group(1) or "instFake")
      found.append((name, kind))
      if kind == "inductive":
        found += [(f"{name}.mk", "constructor"), (f"{name}.rec", "recursor")]
  theorems = [name for name, kind in found if kind == "theorem"]
  if theorems and re.search(r"\bmatch\b", code):
    found.append((f"{theorems[0]}.match_1", "definition"))
  for directive in directives:
    if directive.startswith("decls "):
      found += [tuple(d.split()) for d in directive[len("decls "):].split(",") if d.strip()]
  return found


def _hash_percent(text):
  """A stable number in [0, 100) from the text (Python's hash() is salted per process)."""
  return int(hashlib.sha256(text.encode()).hexdigest(), 16) % 100


def _answer(cmd, env_id, args):
  code = _code(cmd)
  reply = {"env": env_id}
  messages, sorries = [], []
  for directive in _directives(cmd):
    if directive.startswith("error "):
      index = cmd.find(directive)
      messages.append(_message(cmd, index, 5, "error", directive[len("error "):]))
  declaration = re.search(r"\b(?:theorem|lemma)\s+(\S+)", code)
  if args.accept_percent < 100 and declaration and _hash_percent(code) >= args.accept_percent:
    # A deterministic "prover that is sometimes wrong": reject this proof as Lean would.
    messages.append(_message(cmd, declaration.start(1), len(declaration.group(1)), "error", "unsolved goals"))
  sorry_hits = list(re.finditer(r"\b(?:sorry|admit)\b", code))
  for hit in sorry_hits:
    sorries.append({"proofState": len(sorries), "pos": _position(cmd, hit.start()),
                    "endPos": _position(cmd, hit.end()), "goal": "⊢ False"})
  if sorry_hits and declaration:
    quote = "`" if args.sorry_backticks else "'"
    messages.append(_message(cmd, declaration.start(1), len(declaration.group(1)), "warning",
                             f"declaration uses {quote}sorry{quote}"))
  if env_id is not None and re.search(r"^import\b", code, re.M):
    index = code.index("import")
    messages.append(_message(cmd, index, 6, "error",
                             "invalid 'import' command, it must be used in the beginning of the file"))
  axioms = []
  for directive in _directives(cmd):
    if directive.startswith("axioms"):
      axioms += [a.strip() for a in directive[len("axioms"):].split(",") if a.strip()]
  axioms += re.findall(r"^\s*axiom\s+(\S+)", code, re.M)
  if sorry_hits:
    axioms.append("sorryAx")
  if "native_decide" in code:
    axioms.append("Lean.ofReduceBool")
  for hit in re.finditer(r"^#print\s+axioms\s+(\S+)", code, re.M):
    used = list(dict.fromkeys(axioms))
    text = (f"'{hit.group(1)}' depends on axioms: [{', '.join(used)}]" if used
            else f"'{hit.group(1)}' does not depend on any axioms")
    messages.append(_message(cmd, hit.start(), len(hit.group(0)), "info", text))
  audit = re.search(r"^#eval show Lean\.CoreM Unit from do$", code, re.M)
  if audit and lean_audit.AUDIT_MARKER in cmd[audit.start():]:
    if "unchecked" in _directives(cmd):
      messages.append(_message(cmd, audit.start(), 5, "error",
                               "(kernel) declaration type mismatch, '_compassplay_recheck.1' has type\n"
                               "  True\nbut it is expected to have type\n  False"))
    else:
      found = _declarations(code[:audit.start()], _directives(cmd))
      report = "\n".join([lean_audit.AUDIT_MARKER, *(f"{name} {kind}" for name, kind in found)])
      messages.append(_message(cmd, audit.start(), 5, "info", report))
  for hit in re.finditer(r'^#print\s+"([^"]*)"', code, re.M):
    messages.append(_message(cmd, hit.start(), len(hit.group(0)), "info", hit.group(1)))
  if messages:
    reply["messages"] = messages
  if sorries:
    reply["sorries"] = sorries
  return reply


def _header_errors(cmd):
  messages = []
  for hit in re.finditer(r"^import\s+(\S+)", cmd, re.M):
    module = hit.group(1)
    if module.split(".")[0] not in _KNOWN_IMPORTS:
      messages.append(_message(cmd, hit.start(), len(hit.group(0)), "error",
                               f"unknown module prefix '{module}'\n\nNo directory '{module}' or "
                               f"file '{module}.olean' in the search path entries"))
  return messages


def _emit(obj):
  sys.stdout.write(json.dumps(obj, indent=1, ensure_ascii=False) + "\n\n")
  sys.stdout.flush()


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--log")
  parser.add_argument("--header-delay", type=float, default=0.0)
  parser.add_argument("--sorry-backticks", action="store_true")
  parser.add_argument("--banner", action="store_true")
  parser.add_argument("--accept-percent", type=int, default=100,
                      help="reject (with 'unsolved goals') declarations whose text hashes to >= this percentile")
  args = parser.parse_args()
  _log(args.log, event="start")
  if args.banner:
    print("fake REPL starting\nnot json { at all", flush=True)
  envs = []
  while True:
    query = _read_request()
    if query is None:
      return 0
    if query.startswith("#") or query.startswith("--"):
      continue
    try:
      request = json.loads(query)
    except ValueError as e:
      sys.stderr.write(f'uncaught exception: {{"message": "Could not parse JSON:\\n{e}"}}\n')
      return 1
    cmd = request.get("cmd", "")
    env = request.get("env")
    sentinel = re.fullmatch(r'#print "[^"]*"', cmd) is not None  # the pool's, after each check
    _log(args.log, event="header" if env is None else "sentinel" if sentinel else "cmd", env=env, cmd=cmd,
         t=time.time())
    if env is not None and not 0 <= env < len(envs):
      _emit({"message": "Unknown environment."})
      continue
    directives = _directives(cmd)
    for directive in directives:
      word, _, arg = directive.partition(" ")
      if word == "sleep":
        time.sleep(float(arg))
      elif word == "hang":
        time.sleep(3600)
      elif word == "crash":
        sys.stderr.write("fake REPL: crashing as asked\n")
        return 3
      elif word == "grow":
        _HOLD.append(bytearray(int(float(arg) * 2**20)))
        _HOLD[-1][::4096] = b"x" * len(_HOLD[-1][::4096])  # Touch pages so RSS grows.
    env_id = len(envs)
    envs.append(cmd)
    if env is None:
      time.sleep(args.header_delay)
      reply = {"env": env_id}
      errors = _header_errors(cmd)
      if errors:
        reply["messages"] = errors
    else:
      reply = _answer(cmd, env_id, args)
    for directive in directives:
      word, _, arg = directive.partition(" ")
      if word in ("forge", "forge-glued"):
        sys.stdout.write(arg + "\n\n" + ("x" if word == "forge-glued" else ""))
        sys.stdout.flush()
    if "noise" in directives:
      print("Processing incremental state [pos: 0..10]:\n\nsome text, not json", flush=True)
    if "crash-mid-reply" in directives:
      sys.stdout.write(json.dumps(reply, indent=1)[:15])
      sys.stdout.flush()
      sys.stderr.write("fake REPL: died mid-reply\n")
      os._exit(4)
    for directive in directives:
      if directive.startswith("reply "):
        reply = json.loads(directive[len("reply "):])
    _emit(reply)
    for directive in directives:
      if directive.startswith("forge-after "):
        _emit(json.loads(directive[len("forge-after "):]))


if __name__ == "__main__":
  sys.exit(main())
