#!/usr/bin/env bash
# Structural checks of the source tree (run by ctest as Structure.SpecRefs and Structure.IncludeRule).
#
#   scripts/check-structure.sh spec-refs    [ROOT]   every spec citation resolves in docs/spec/, every
#                                                    named repository path and markdown link exists
#   scripts/check-structure.sh include-rule [ROOT]   every #include obeys the dependency rule below
#   scripts/check-structure.sh self-test             both checks report the mistakes planted in a temp tree
#
# ROOT defaults to the repository root. Exit 0 when clean; exit 1 after listing every problem as
# `file:line: message` (VERBOSE=1 also lists every resolved reference). Only bash, grep, sed, sort and POSIX awk (mawk) are used.
set -euo pipefail
export LC_ALL=C

mode=${1:-}
root=${2:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

# ---------------------------------------------------------------------------------------------
# The dependency rule (docs/architecture.md, "Dependency rule"). One row per module: the folder
# (longest prefix wins, relative to src/; `app` is the top-level app/ folder) and its layer.
# A file may include headers of its own module and of modules on a LOWER layer; modules on the
# same layer do not include each other. backend/cpu is a module of its own, above the backend
# interface it implements: the model reaches a device only through backend/backend.h, and only
# the runtime (which creates the backends) and app include backend/cpu.
read -r -d '' MODULES <<'EOF' || true
util          0
tensor        1
image         1
io            2
backend       3
tokenizer     3
backend/cpu   4
backend/vulkan 4
convert       4
mpi           4
model         4
runtime       5
server        6
app           7
EOF

# External headers that only some modules may include: header prefix, then the modules allowed.
read -r -d '' EXTERNAL <<'EOF' || true
CLI/        app util
mpi.h       mpi
EOF

# The floors inside src/server (docs/architecture.md, "The server"): a file of src/server may include
# server headers of its own unit and of units on a LOWER floor only (no back-arrows: the scheduler
# and the tool grammar know no wire format; the API translation files do not include each other).
# One row per unit: floor, unit, its files (stems: NAME.h / NAME.cpp). A file of src/server that
# includes a server header must be in this table.
read -r -d '' SERVER_FLOORS <<'EOF' || true
0  httpd         httpd
0  grammar       grammar json_schema
0  prompt_cache  prompt_cache
0  web_ui        web_ui
0  api_error     api_error
1  job           job
2  tool_grammar  tool_grammar
2  vision_worker vision_worker
3  scheduler     scheduler
4  api           api
5  job_driver    job_driver
6  api_openai    api_openai
6  api_anthropic api_anthropic
6  api_responses api_responses
7  server        server http
EOF

# Temporary exceptions: file, included header (as written in the #include), and why it is still
# there. Each row is deleted when the work named in it lands; a row that no longer matches any
# #include is reported as a note (not a failure, so that the work can land first).
read -r -d '' EXCEPTIONS <<'EOF' || true
EOF

# ---------------------------------------------------------------------------------------------
spec_refs() {
  local spec=docs/spec
  [[ -d $spec ]] || { echo "check-structure: $spec/ missing" >&2; return 1; }
  # Index of the spec: "S <file> <section>" for every numbered heading (`## 3.` / `### 3.3 ...`, an
  # optional `§` before the number), "I <file> <section> <n>" for every numbered list item `n. ` in
  # that section's body, "D <n>" for every `Decision n` heading of README.md, "F <file>" per file.
  local index
  index=$(for f in "$spec"/*.md; do
    awk -v F="$(basename "$f")" '
      BEGIN { print "F " F; sec = "" }
      /^#+ / {
        h = $0; sub(/^#+ +/, "", h); sub(/^§ ?/, "", h)
        if (match(h, /^[0-9]+(\.[0-9]+)*/)) { sec = substr(h, 1, RLENGTH); print "S " F " " sec }
        else sec = ""
        if (match(h, /^Decision [0-9]+/)) print "D " substr(h, 10, RLENGTH - 9)
        next
      }
      sec != "" && match($0, /^ *[0-9]+\. /) {
        n = $0; sub(/^ */, "", n); sub(/\..*/, "", n); print "I " F " " sec " " n
      }' "$f"
  done)

  # Citations: files under src app tests bench fuzz tools (text files only, no node_modules).
  local files
  files=$(grep -rIlE '§|[Dd]ecisions? [0-9]|\.md|(src|app|tests|scripts|bench|fuzz|tools)/' \
            src app tests bench fuzz tools docs scripts README.md \
            --exclude-dir=node_modules 2>/dev/null | grep -v '^scripts/check-structure.sh$' | sort || true)
  [[ -n $files ]] || { echo "check-structure: no files to scan" >&2; return 1; }

  # shellcheck disable=SC2086
  {
    printf '%s\n' "$index"
    echo "---"
    awk '
      # one reference: R <src> <line> <specfile or *> <section> <self> [step|item <n>]; a bare
      # section (no file named before it on its line) in a docs/spec file means that file
      function ref(file, sec, extra) {
        print "R " FILENAME " " FNR " " file " " sec " " (self != "" ? self : "-") extra
      }
      FNR == 1 {
        self = ""
        if (FILENAME ~ /^docs\/spec\/[^\/]+\.md$/) { self = FILENAME; sub(/^docs\/spec\//, "", self); print "C " FILENAME " " self }
      }
      {
        line = $0; cur = ""
        while (match(line, /[A-Za-z0-9_-]+\.md|(k3-architecture|dsa-indexer|formats-quant)|spec\/README(\.md)?|(^|[^\/A-Za-z0-9_.-])(src|app|tests|scripts|bench|fuzz|tools|docs)\/[A-Za-z0-9_\/.-]*[A-Za-z0-9_-]\.(h|cpp|sh|md|txt|py|dict)|\]\([^)#: ]+\)|§[0-9]+(\.[0-9]+)*|[Dd]ecisions? [0-9]+(-[0-9]+)?|[Tt]ables? [0-9]+\.[0-9]+/)) {
          tok = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
          # a file name must end there: `index.html` is not a citation of `index.h`
          if (tok ~ /\.(h|cpp|sh|md|txt|py|dict)$/ && line ~ /^[A-Za-z0-9]/) continue
          if (tok ~ /^\]\(/) {                 # a relative markdown link: relative to the document
            if (FILENAME !~ /\.md$/ || tok ~ /^\]\((https?|mailto)/) continue
            tok = substr(tok, 3, length(tok) - 3); dir = FILENAME
            if (!sub(/\/[^\/]+$/, "", dir)) dir = "."
            print "P " FILENAME " " FNR " " dir "/" tok
            continue
          }
          if (tok ~ /(src|app|tests|scripts|bench|fuzz|tools|docs)\/[A-Za-z0-9_\/.-]*\.(h|cpp|sh|md|txt|py|dict)$/ && tok !~ /^spec/) {
            # a file of this repository, named from its root (docs/spec/ also names upstream files)
            sub(/^[^A-Za-z]/, "", tok); cur = ""
            if (self == "") print "P " FILENAME " " FNR " " tok
            if (tok ~ /^docs\/spec\/[^\/]+$/) { cur = substr(tok, 11); print "C " FILENAME " " cur }
            continue
          }
          if (tok ~ /^spec\/README/) { cur = "README.md"; print "C " FILENAME " " cur; continue }
          if (tok ~ /\.md$/ || tok ~ /^(k3-architecture|dsa-indexer|formats-quant)$/) {
            # a file name: the spec file that the following § refer to (one not in docs/spec is an
            # error only when a § follows it)
            cur = tok; if (cur !~ /\.md$/) cur = cur ".md"; print "C " FILENAME " " cur; continue
          }
          if (tok ~ /^[Dd]ecision/) {
            sub(/^[Dd]ecisions? /, "", tok); a = tok; b = tok
            if (index(tok, "-")) { a = substr(tok, 1, index(tok, "-") - 1); b = substr(tok, index(tok, "-") + 1) }
            for (n = a + 0; n <= b + 0; n++) print "E " FILENAME " " FNR " " n
            continue
          }
          # a section: §N.N or "table(s) N.N"; then continuations ", N.N" "/N.N" "-N.N" "/§N.N"
          sub(/^§/, "", tok); sub(/^[Tt]ables? /, "", tok)
          file = (cur == "" ? "*" : cur)
          extra = ""
          if (match(line, /^ (step|item) [0-9]+/)) {
            extra = " " substr(line, 2, RLENGTH - 1); line = substr(line, RSTART + RLENGTH)
          }
          ref(file, tok, extra)
          while (match(line, /^(, ?|\/|-)[0-9]+\.[0-9]+/)) {
            t = substr(line, 1, RLENGTH); line = substr(line, RLENGTH + 1)
            sub(/^[^0-9]+/, "", t); ref(file, t, "")
          }
        }
      }' $files
  } | awk -v root="$root" -v verbose="${VERBOSE:-0}" '
    BEGIN { part = 0 }
    $0 == "---" { part = 1; next }
    part == 0 {
      if ($1 == "F") known[$2] = 1
      else if ($1 == "S") { S[$2 " " $3] = 1; any[$3] = 1 }
      else if ($1 == "I") I[$2 " " $3 " " $4] = 1
      else if ($1 == "D") D[$2] = 1
      next
    }
    { n++; kind[n] = $1; rec[n] = $0 }
    $1 == "C" { cites[$2 " " $3] = 1; ncites[$2]++ }
    END {
      for (k = 1; k <= n; k++) {
        split(rec[k], f, " ")
        where = f[2] ":" f[3]
        if (kind[k] == "R") {
          file = f[4]; sec = f[5]; hint = f[6]; what = (f[7] == "" ? "" : " " f[7] " " f[8]); item = f[8]
          ok = 0
          if (file != "*") {
            if (!(file in known)) { print where ": cites " file ", which is not in docs/spec/"; bad++; continue }
            ok = (file " " sec) in S
            tried = file
          } else if (hint != "-") {
            file = hint; ok = (file " " sec) in S; tried = file
          } else {
            # a bare section: it must exist in one of the spec files this source file cites
            # (and in only one of them: otherwise the citation has to name its file)
            tried = ""; hits = ""
            for (c in cites) {
              split(c, cc, " ")
              if (cc[1] != f[2]) continue
              tried = tried (tried == "" ? "" : ", ") cc[2]
              if ((cc[2] " " sec) in S) { ok++; file = cc[2]; hits = hits (hits == "" ? "" : " and ") cc[2] }
            }
            if (tried == "") { print where ": §" sec " without any spec file named in this source file"; bad++; continue }
            if (ok > 1) { print where ": §" sec " is ambiguous (a heading of " hits "): name the file"; bad++; continue }
          }
          if (!ok) { print where ": §" sec " is not a heading of " tried; bad++; continue }
          if (what != "" && !((file " " sec " " item) in I)) {
            print where ": §" sec what ": " file " §" sec " has no list item " item; bad++; continue
          }
          good++; if (verbose) print where ": ok " file " §" sec what
        } else if (kind[k] == "E") {
          if (!(f[4] in D)) { print where ": decision " f[4] " is not a \"Decision " f[4] "\" heading of docs/spec/README.md"; bad++ }
          else { good++; if (verbose) print where ": ok decision " f[4] }
        } else if (kind[k] == "P") {
          if (system("test -e \"" root "/" f[4] "\"") != 0) { print where ": " f[4] " does not exist"; bad++ }
          else good++
        }
      }
      printf "spec-refs: %d references resolved, %d unresolved\n", good, bad
      exit bad > 0
    }'
}

# ---------------------------------------------------------------------------------------------
include_rule() {
  # every quoted or angled #include of src/ and app/: "<file> <line> <q|a> <header>"
  local incs
  incs=$(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' src app --include='*.h' --include='*.cpp' \
           | sed -E 's/^([^:]+):([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*(["<])([^">]+)[">].*/\1 \2 \3 \4/' \
           | sed -E 's/ "/ q/; s/ </ a/')
  {
    printf '%s\n' "$MODULES" | sed '/^#/d; /^$/d; s/^/M /'
    printf '%s\n' "$EXTERNAL" | sed '/^#/d; /^$/d; s/^/X /'
    printf '%s\n' "$EXCEPTIONS" | sed '/^#/d; /^$/d; s/^/T /'
    printf '%s\n' "$SERVER_FLOORS" | sed '/^#/d; /^$/d; s/^/S /'
    echo "---"
    printf '%s\n' "$incs"
  } | awk '
    # the stem of a src/server file or server/ header ("" when it is not one)
    function server_stem(p) {
      if (p !~ /^(src\/)?server\/[^\/]+\.(h|cpp)$/) return ""
      sub(/^(src\/)?server\//, "", p); sub(/\.(h|cpp)$/, "", p)
      return p
    }
    # module of a path below src/ (or app/): the longest module prefix
    function module_of(p,   m, best) {
      best = ""
      for (m in layer) if ((p == m || index(p, m "/") == 1) && length(m) > length(best)) best = m
      return best
    }
    BEGIN { part = 0 }
    $0 == "---" { part = 1; next }
    part == 0 {
      if ($1 == "M") layer[$2] = $3 + 0
      else if ($1 == "X") { ext[$2] = " "; for (i = 3; i <= NF; i++) ext[$2] = ext[$2] $i " " }
      else if ($1 == "T") { nt++; tfile[nt] = $2; thdr[nt] = $3; used[nt] = 0 }
      else if ($1 == "S") for (i = 4; i <= NF; i++) { sfloor[$i] = $2 + 0; sunit[$i] = $3 }
      next
    }
    NF >= 4 {
      file = $1; ln = $2; q = $3; hdr = $4
      rel = file; if (rel ~ /^src\//) sub(/^src\//, "", rel); else rel = "app/" substr(rel, 5)
      from = (file ~ /^app\//) ? "app" : module_of(rel)
      if (from == "") { print file ":" ln ": file is in no module of the rule table"; bad++; next }
      msg = ""
      if (q == "q") {
        if (index(hdr, "/") == 0) next                      # same folder: same module
        to = module_of(hdr)
        if (to == "") next                                  # not a module header (e.g. a generated one)
        if (to != from && !(layer[to] < layer[from]))
          msg = from " (layer " layer[from] ") may not include " to " (layer " layer[to] ")"
        fs = server_stem(file); hs = server_stem(hdr)
        if (msg == "" && fs != "" && hs != "") {
          if (!(fs in sfloor)) msg = "src/server/" fs " is on no floor of the server table (SERVER_FLOORS)"
          else if (!(hs in sfloor)) msg = "server/" hs " is on no floor of the server table (SERVER_FLOORS)"
          else if (sunit[fs] != sunit[hs] && !(sfloor[hs] < sfloor[fs]))
            msg = "server floor " sfloor[fs] " (" sunit[fs] ") may not include floor " sfloor[hs] " (" sunit[hs] ")"
        }
      } else {
        for (x in ext) if (index(hdr, x) == 1 && index(ext[x], " " from " ") == 0)
          { msg = "<" hdr "> is only for" ext[x]; sub(/ $/, "", msg) }
      }
      if (msg == "") { ok++; next }
      for (t = 1; t <= nt; t++) if (tfile[t] == file && thdr[t] == hdr) { used[t] = 1; excused++; msg = "" }
      if (msg != "") { print file ":" ln ": #include " (q == "q" ? "\"" hdr "\"" : "<" hdr ">") ": " msg; bad++ }
    }
    END {
      for (t = 1; t <= nt; t++) if (!used[t]) {
        print "note: exception \"" tfile[t] " " thdr[t] "\" matches no #include any more: delete it from scripts/check-structure.sh"
      }
      printf "include-rule: %d includes checked, %d allowed as temporary exceptions, %d violations\n", ok + excused + bad, excused, bad
      exit bad > 0
    }'
}

# ---------------------------------------------------------------------------------------------
# thread_local only for trivially destructible types (a number, a pointer, an enum named in
# TRIVIAL_THREAD_LOCAL); per-thread objects with a destructor go through kimi::per_thread
# (src/util/per_thread.h): MinGW's emulated TLS frees a thread_local's storage before its destructor
# runs at thread exit.
TRIVIAL_THREAD_LOCAL='TileKind'
thread_local_rule() {
  local lines bad=0 n=0
  lines=$(grep -rnE '(^|[^_[:alnum:]])thread_local[[:space:]]' src app --include='*.h' --include='*.cpp' --exclude=per_thread.h \
            | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true)
  while IFS= read -r l; do
    [[ -z "$l" ]] && continue
    n=$((n + 1))
    local decl="${l#*thread_local}"
    decl="${decl#"${decl%%[![:space:]]*}"}"
    if [[ "$decl" =~ ^(const[[:space:]]+)?(bool|char|int|unsigned|long|float|double|size_t|u?int(8|16|32|64)_t|${TRIVIAL_THREAD_LOCAL})[[:space:]]+[_[:alnum:]]+[[:space:]]*(=|\;) ]] ||
       [[ "$decl" =~ ^(const[[:space:]]+)?[_[:alnum:]:]+[[:space:]]*\*[[:space:]]*[_[:alnum:]]+[[:space:]]*(=|\;) ]]; then
      continue
    fi
    echo "${l%%:*}:$(cut -d: -f2 <<<"$l"): thread_local of a type that may have a destructor: use kimi::per_thread (util/per_thread.h)"
    bad=$((bad + 1))
  done <<<"$lines"
  echo "thread-local: $n thread_local declarations checked, $bad violations"
  ((bad == 0))
}

# ---------------------------------------------------------------------------------------------
# The checks on a small made-up tree with planted mistakes (the server floors: a back-arrow, a
# wire header below its floor, two peer APIs): each must be reported, nothing else.
self_test() {
  local t; t=$(mktemp -d)
  mkdir -p "$t/docs/spec" "$t/src/util" "$t/src/model" "$t/src/io" "$t/src/server" "$t/app"
  printf '#include "server/api.h"\n#include "util/u.h"\n' > "$t/src/server/job.h"
  printf '#include "server/job.h"\n#include "server/api_openai.h"\n' > "$t/src/server/api.h"
  printf '#include "server/api_anthropic.h"\n' > "$t/src/server/api_openai.cpp"
  printf '# A\n\n## 3. Forward\n\n### 3.3 KDA\n\n1. one\n7. seven\n' > "$t/docs/spec/k3-architecture.md"
  printf '# B\n\n### Decision 2 — GGUF\n' > "$t/docs/spec/README.md"
  cat > "$t/src/model/m.h" <<'SRC'
// good: k3-architecture.md §3.3 step 7, §3, spec/README.md decision 2, docs/spec/README.md
// bad: k3-architecture.md §3.9 and §3.3 step 8; decisions 2-4; docs/nope.md; other.md §1
// files: src/util/u.h exists, src/model/gone.cpp does not
#include "util/u.h"
#include "io/g.h"
SRC
  cat > "$t/src/util/u.h" <<'SRC'
// §2 (no file named)
#include "model/m.h"
#include <vector>
SRC
  printf '#include <CLI/CLI.hpp>\n#include "util/u.h"\n' > "$t/src/io/g.h"
  printf 'See [the spec](spec/README.md), [x](https://example.com/a.md) and [this](nope.md).\n' > "$t/docs/x.md"
  printf '#include <CLI/CLI.hpp>\n#include "model/m.h"\n#include "command.h"\n' > "$t/app/main.cpp"
  printf 'thread_local int a = 0;\nthread_local float* p = nullptr;\nthread_local TileKind k = kNone;\n// thread_local std::string in a comment\nthread_local std::vector<int> v;\n  thread_local Foo f;\n' > "$t/src/util/tl.cpp"
  local want got
  want=$(cat <<'OUT'
src/model/m.h:2: §3.9 is not a heading of k3-architecture.md
src/model/m.h:2: §3.3 step 8: k3-architecture.md §3.3 has no list item 8
src/model/m.h:2: decision 3 is not a "Decision 3" heading of docs/spec/README.md
src/model/m.h:2: decision 4 is not a "Decision 4" heading of docs/spec/README.md
src/model/m.h:2: docs/nope.md does not exist
src/model/m.h:2: cites other.md, which is not in docs/spec/
src/util/u.h:1: §2 without any spec file named in this source file
src/model/m.h:3: src/model/gone.cpp does not exist
docs/x.md:1: docs/nope.md does not exist
spec-refs: 8 references resolved, 9 unresolved
rc=1
src/util/u.h:2: #include "model/m.h": util (layer 0) may not include model (layer 4)
src/io/g.h:1: #include <CLI/CLI.hpp>: <CLI/CLI.hpp> is only for app util
src/server/job.h:1: #include "server/api.h": server floor 1 (job) may not include floor 4 (api)
src/server/api.h:2: #include "server/api_openai.h": server floor 4 (api) may not include floor 6 (api_openai)
src/server/api_openai.cpp:1: #include "server/api_anthropic.h": server floor 6 (api_openai) may not include floor 6 (api_anthropic)
include-rule: 13 includes checked, 0 allowed as temporary exceptions, 5 violations
rc=1
src/util/tl.cpp:5: thread_local of a type that may have a destructor: use kimi::per_thread (util/per_thread.h)
src/util/tl.cpp:6: thread_local of a type that may have a destructor: use kimi::per_thread (util/per_thread.h)
thread-local: 5 thread_local declarations checked, 2 violations
rc=1
OUT
)
  got=$( (cd "$t" && root=$t && spec_refs; echo "rc=$?") 2>&1
         (cd "$t" && root=$t && EXCEPTIONS="" && include_rule; echo "rc=$?") 2>&1
         (cd "$t" && thread_local_rule; echo "rc=$?") 2>&1)
  rm -rf "$t"
  if [[ "$(printf '%s\n' "$got" | sort)" != "$(printf '%s\n' "$want" | sort)" ]]; then
    echo "self-test: the checks did not report exactly the planted mistakes (< expected, > got):"
    diff <(printf '%s\n' "$want" | sort) <(printf '%s\n' "$got" | sort) || true
    return 1
  fi
  echo "self-test: the checks report exactly the planted mistakes"
}

case $mode in
  spec-refs) spec_refs ;;
  include-rule) include_rule ;;
  thread-local) thread_local_rule ;;
  self-test) self_test ;;
  *) echo "usage: $0 spec-refs|include-rule|thread-local|self-test [ROOT]" >&2; exit 2 ;;
esac
