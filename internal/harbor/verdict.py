"""kiln's verdict for a kiln task exported as a Harbor task.

Written by `kiln export --format harbor` (kiln's docs/data-and-grading.md
section 7.5) into tests/ beside test.sh, which calls it:

  kiln_verdict.py pytest REQUIRED.json STDOUT STDERR   (grading kind swebench)
  kiln_verdict.py swepro REQUIRED.json RESULT.json     (grading kind swepro)
  kiln_verdict.py parse LOG                            (prints the statuses)

REQUIRED.json is {"fail_to_pass": [...], "pass_to_pass": [...]}. The reward
is 1 iff that set is not empty and every test in it passed, written to
/logs/verifier/reward.txt, with the per-test statuses in
/logs/verifier/tests.json. The pytest parser is kiln-grade's, line for line
(kiln's stages/grade tests that both agree); it runs on Python 3.5 and up.
"""
import json
import re
import sys

RANK = {"PASSED": 1, "XFAIL": 1, "XPASS": 1, "SKIPPED": 2, "FAILED": 3, "ERROR": 3}
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
XDIST = re.compile(r"^\[gw\d+\][ \t\n\f\r]+\[[ \t\n\f\r]*\d+%\][ \t\n\f\r]+")
VSUFFIX = re.compile(r"([ \t\n\f\r]+\(.*\))?([ \t\n\f\r]+\[[ \t\n\f\r]*\d+%\])?[ \t\n\f\r]*\Z")
LOGS = "/logs/verifier"


def split_node_id(s):
    """Split s at its first space or tab outside square brackets."""
    depth = 0
    for i, c in enumerate(s):
        if c == "[":
            depth += 1
        elif c == "]":
            if depth > 0:
                depth -= 1
        elif c in " \t" and depth == 0:
            return s[:i], s[i + 1:].strip()
    return s, ""


def parse_pytest(log):
    """Each reported test's status: the -rA summary, -v and xdist lines;
    when a test is reported twice the worst status wins."""
    out = {}

    def record(node, status):
        if not node:
            return
        old = out.get(node)
        if old is not None and RANK[old] >= RANK[status]:
            return
        out[node] = status

    for line in log.split("\n"):
        line = ANSI.sub("", line).rstrip(" \t\r")
        line = XDIST.sub("", line, count=1)
        word, sep, rest = line.partition(" ")
        if sep and word in RANK:
            node, _ = split_node_id(rest)
            if node and not node.startswith("["):
                record(node, word)
            continue
        node, rest = split_node_id(line)
        if "::" not in node or not rest:
            continue
        word, _, tail = rest.partition(" ")
        if word not in RANK or not VSUFFIX.match(" " + tail):
            continue
        record(node, word)
    return out


def read(path):
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def swepro_statuses(path):
    """SWE-bench Pro's result.json: the PASSED entries' names pass; other
    statuses are kept for the record."""
    text = read(path).strip()
    tests = json.loads(text)["tests"] if text else []
    out = {}
    for tc in tests:
        name, status = tc.get("name"), tc.get("status")
        if status == "PASSED":
            if name is None:
                raise SystemExit("result.json: a PASSED test has no name")
            out[name] = "PASSED"
        elif name is not None and not out.get(name):
            out[name] = status
    return out


def main(argv):
    mode = argv[1] if len(argv) > 1 else ""
    if mode == "parse" and len(argv) == 3:
        json.dump(parse_pytest(read(argv[2])), sys.stdout, sort_keys=True)
        return 0
    if mode == "pytest" and len(argv) == 5:
        statuses = parse_pytest(read(argv[3]) + "\n" + read(argv[4]))
        passed = ("PASSED", "XFAIL", "XPASS")
    elif mode == "swepro" and len(argv) == 4:
        statuses = swepro_statuses(argv[3])
        passed = ("PASSED",)
    else:
        sys.stderr.write("usage: kiln_verdict.py pytest REQUIRED STDOUT STDERR | swepro REQUIRED RESULT | parse LOG\n")
        return 2
    with open(argv[2]) as f:
        req = json.load(f)
    ok = len(req["fail_to_pass"]) + len(req["pass_to_pass"]) > 0
    view = {}
    for key in ("fail_to_pass", "pass_to_pass"):
        view[key] = {}
        for name in req[key]:
            status = statuses.get(name, "MISSING")
            view[key][name] = status
            ok = ok and status in passed
    view["reported"] = len(statuses)
    with open(LOGS + "/tests.json", "w") as f:
        json.dump(view, f, sort_keys=True)
    with open(LOGS + "/reward.txt", "w") as f:
        f.write("1\n" if ok else "0\n")
    sys.stdout.write("kiln verdict: reward %d\n" % (1 if ok else 0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
