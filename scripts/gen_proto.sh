#!/usr/bin/env bash
# Regenerates the protobuf message stubs in fcache/protocol/_gen from proto/ (make proto).
# The health service's stubs come from grpcio-health-checking, not from here.
#
# Needs grpcio-tools from the "dev" extra (pip install -e ".[dev]"); nothing at run time
# needs it or the network. Only message stubs are generated (--python_out, --pyi_out):
# the service glue lives in fcache/cache/remote/ and service/servicer.py, built from
# the descriptors, because grpc_python_out code refuses to import under a grpcio older
# than the grpcio-tools that generated it.
#
# The output is reproducible: the same grpcio-tools version gives byte-identical files.
# protoc writes imports as "from fcache.v1 import ..."; they are rewritten to
# "fcache.protocol._gen.fcache.v1" so the stubs import as a subpackage without sys.path
# hacks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python=${PYTHON:-python3}
[ -x .venv/bin/python ] && python=${PYTHON:-.venv/bin/python}

out=fcache/protocol/_gen
protos=(fcache/v1/cache.proto)

rm -rf "$out"
mkdir -p "$out"
"$python" -m grpc_tools.protoc -I proto --python_out="$out" --pyi_out="$out" "${protos[@]}"

# Make every generated directory a package, and point cross-file imports at it.
find "$out" -type d -exec touch {}/__init__.py \;
find "$out" -name '*.py' -o -name '*.pyi' | while read -r f; do
  sed -i -E 's/^from fcache\.v1 import /from fcache.protocol._gen.fcache.v1 import /' "$f"
done
if grep -rnE '^(from|import) fcache\.v1' "$out"; then
  echo "gen_proto.sh: an import above was not rewritten" >&2
  exit 1
fi

tools=$("$python" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))')
echo "generated $out with grpcio-tools $tools ($("$python" -m grpc_tools.protoc --version))"
