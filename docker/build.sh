#!/usr/bin/env bash
# Build a slapo image, optionally smoke-check it (docker/README.md).
#   bash docker/build.sh [cpu|gpu] [--base IMAGE] [--wheels DIR] [--ca-certs DIR|none]
#                        [--tag NAME] [--target STAGE] [--smoke] [--out DIR]
#   --base IMAGE    base image (default: the Dockerfile's: python slim / NVIDIA CUDA runtime);
#                   docker/local-base.sh makes one where no registry is reachable
#   --wheels DIR    a folder of wheels (the torch CPU wheel) for when download.pytorch.org is
#                   unreachable (CPU image only)
#   --ca-certs DIR  extra CA certificates (*.crt) to trust during the build and in the image;
#                   default: /usr/local/share/ca-certificates when it holds any; `none`: none
#   --target STAGE  build only up to a stage (gpu: `system`, the layers without CUDA)
#   --smoke         then run, inside the image, a subset of the tests and docker/smoke.cfg, with
#                   results, figure and test log written to --out (default: results/docker-smoke-FLAVOUR)
# DOCKER=/path/to/docker picks the client. BuildKit is needed (RUN --mount): `docker buildx`, or
# a Docker 20.10-22 client with DOCKER_BUILDKIT=1 (e.g. Debian's docker.io: DOCKER=/usr/bin/docker).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKER="${DOCKER:-docker}"
fail() { echo "build.sh: ERROR: $*" >&2; exit 2; }
say() { echo "build.sh: $*"; }

FLAVOUR=cpu; BASE=""; WHEELS=""; CERTS=""; TAG=""; TARGET=""; SMOKE=0; OUT=""
if [[ $# -gt 0 && "$1" != -* ]]; then FLAVOUR="$1"; shift; fi
while [[ $# -gt 0 ]]; do
  case "$1" in
    --base) BASE="${2:?--base needs an image name}"; shift 2 ;;
    --wheels) WHEELS="${2:?--wheels needs a folder}"; shift 2 ;;
    --ca-certs) CERTS="${2:?--ca-certs needs a folder or none}"; shift 2 ;;
    --tag) TAG="${2:?--tag needs a name}"; shift 2 ;;
    --target) TARGET="${2:?--target needs a stage name}"; shift 2 ;;
    --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
    --smoke) SMOKE=1; shift ;;
    -h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) fail "unknown argument '$1' (see: bash docker/build.sh --help)" ;;
  esac
done
[[ "$FLAVOUR" == cpu || "$FLAVOUR" == gpu ]] || fail "flavour must be cpu or gpu, got '$FLAVOUR'"
TAG="${TAG:-slapo:$FLAVOUR${TARGET:+-$TARGET}}"
OUT="${OUT:-$ROOT/results/docker-smoke-$FLAVOUR}"
"$DOCKER" info >/dev/null 2>&1 || fail "'$DOCKER info' failed: is the Docker daemon running (dockerd) and may you use it?"

# BuildKit: buildx when the client has it, else the classic client's built-in BuildKit.
if "$DOCKER" buildx version >/dev/null 2>&1; then
  build() { "$DOCKER" buildx build --load "$@"; }
else
  build() {
    DOCKER_BUILDKIT=1 "$DOCKER" build "$@" || fail "the build failed; if the message above says \
'BuildKit is enabled but the buildx component is missing', install docker-buildx or point \
DOCKER= at a Docker 20.10-22 client (Debian's docker.io: DOCKER=/usr/bin/docker)"
  }
fi

# The optional build inputs (wheels, CA certificates) as a small local image, stage 'inputs'.
if [[ -z "$CERTS" ]] && compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  CERTS=/usr/local/share/ca-certificates
fi
[[ "$CERTS" == none ]] && CERTS=""
ARGS=(-f "$ROOT/docker/Dockerfile.$FLAVOUR" -t "$TAG")
[[ -n "$BASE" ]] && ARGS+=(--build-arg "BASE_IMAGE=$BASE")
[[ -n "$TARGET" ]] && ARGS+=(--target "$TARGET")
[[ -n "$TARGET" && $SMOKE -eq 1 ]] && fail "--smoke needs the whole image; drop --target"
if [[ -n "$WHEELS$CERTS" ]]; then
  INPUTS="$(mktemp -d)"
  trap 'rm -rf "$INPUTS"' EXIT
  mkdir -p "$INPUTS/wheels" "$INPUTS/ca-certificates"
  if [[ -n "$WHEELS" ]]; then
    compgen -G "$WHEELS/*.whl" >/dev/null || fail "--wheels $WHEELS holds no *.whl file"
    cp -l "$WHEELS"/*.whl "$INPUTS/wheels/" 2>/dev/null || cp "$WHEELS"/*.whl "$INPUTS/wheels/"
  fi
  if [[ -n "$CERTS" ]]; then
    compgen -G "$CERTS/*.crt" >/dev/null || fail "--ca-certs $CERTS holds no *.crt file"
    cp "$CERTS"/*.crt "$INPUTS/ca-certificates/"
  fi
  printf 'FROM scratch\nCOPY . /\n' > "$INPUTS/Dockerfile"
  say "build inputs: wheels from ${WHEELS:-none}, CA certificates from ${CERTS:-none}"
  build -q -t slapo-build-inputs:local "$INPUTS" >/dev/null
  ARGS+=(--build-arg INPUTS_IMAGE=slapo-build-inputs:local)
fi

say "building $TAG from docker/Dockerfile.$FLAVOUR${BASE:+ on $BASE}"
start=$(date +%s)
build "${ARGS[@]}" "$ROOT"
secs=$(( $(date +%s) - start ))
size="$("$DOCKER" image inspect -f '{{.Size}}' "$TAG")"
say "built $TAG in ${secs} s; image size $(( size / 1000000 )) MB"
[[ $SMOKE -eq 1 ]] || exit 0

# Smoke check: a subset of the tests, then the one-line config; everything lands in $OUT.
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
RUN=(--rm --shm-size=2g -v "$OUT:/slapo/results")
if [[ $(id -u) -eq 0 ]]; then chown 1000:1000 "$OUT"          # the image's user 'slapo'
elif [[ $(id -u) -ne 1000 ]]; then RUN+=(--user "$(id -u):$(id -g)" -e HOME=/tmp); fi
[[ "$FLAVOUR" == gpu ]] && RUN+=(--gpus all --ipc=host)
# the subset: schedule, history and shard tests, the fence check, and the quick start's examples
SMOKE_TESTS="${SMOKE_TESTS:-tests/test_schedule.py tests/test_history.py tests/primitives/test_shard.py tests/test_docs.py docs/quickstart.md}"
RUN+=(-e "SMOKE_TESTS=$SMOKE_TESTS")
say "smoke check in $TAG; results in $OUT"
start=$(date +%s)
"$DOCKER" run "${RUN[@]}" "$TAG" bash -c '
  set -euo pipefail
  python -m pytest -q -p no:cacheprovider $SMOKE_TESTS 2>&1 | tee results/smoke-tests.txt
  RESULTS=/slapo/results/smoke.tsv bash end2end/run_all_single_node.sh docker/smoke.cfg --repeat 1'
say "smoke check passed in $(( $(date +%s) - start )) s: $(ls "$OUT" | tr '\n' ' ')"
