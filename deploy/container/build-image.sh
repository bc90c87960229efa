#!/usr/bin/env bash
# Builds farmem's container image offline: no registry, no network. The root filesystem is
# assembled from the files of Debian packages installed on this machine (what `dpkg -L` lists
# for libc6 and libgcc-s1, all farmem, its preload library and the demo need, plus any
# --package and the packages it depends on), farmem, libfarmem_preload.so, the demo program
# (demo.c, compiled here and dynamically linked, so that LD_PRELOAD reaches its heap) and a
# non-root user `farmem` (uid 1000, the image's default user); `podman import` makes the image.
#
# Usage: deploy/container/build-image.sh [--tag IMAGE] [--farmem PATH] [--preload PATH]
#                                        [--package DEB]...
#   --tag      image name (default localhost/farmem:latest)
#   --farmem   the farmem binary (default target/release/farmem)
#   --preload  the preload library (default: next to the binary)
#   --package  also a Debian package installed here, with its dependencies (more than once);
#              the Kubernetes manifests' image: --tag localhost/farmem:local --package dash
#              --package coreutils --package python3
# Needs: root (or rootless podman), podman, a C compiler and binutils (build-essential), and a
# built farmem (cargo build --release). /usr/local/bin holds farmem, libfarmem_preload.so and
# farmem-demo.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tag="localhost/farmem:latest"
farmem="$root/target/release/farmem"
preload=""
packages=(libc6 libgcc-s1)
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --farmem) farmem="$2"; shift 2 ;;
    --preload) preload="$2"; shift 2 ;;
    --package) packages+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$preload" ] || preload="$(dirname "$farmem")/libfarmem_preload.so"

die() { echo "build-image: $*" >&2; exit 1; }
[ -x "$farmem" ] || die "no farmem binary at $farmem: build it (cargo build --release) or pass --farmem"
[ -f "$preload" ] || die "no preload library at $preload: build it (cargo build --release) or pass --preload"
for tool in podman cc readelf tar dpkg-query; do
  command -v "$tool" >/dev/null 2>&1 ||
    die "$tool not found: run scripts/setup.sh (it installs podman, runc and build-essential)"
done

work="$(mktemp -d "${TMPDIR:-/tmp}/farmem-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs"

# One read of dpkg's database: each installed package's dependencies (Pre-Depends, Depends),
# and the installed package providing each virtual package (a dependency may name one).
declare -A depends=() provider=()
while IFS=';' read -r status pkg provides deps; do
  [ "$status" = "install ok installed" ] || continue
  [ -n "${depends[$pkg]:-}" ] || depends[$pkg]="$deps,"
  IFS=',' read -ra virtuals <<<"$provides"
  for v in "${virtuals[@]}"; do
    v="${v%%(*}"; v="${v// /}"
    [ -z "$v" ] || [ -n "${provider[$v]:-}" ] || provider[$v]="$pkg"
  done
done < <(dpkg-query -W -f='${Status};${Package};${Provides};${Pre-Depends},${Depends}\n')

# The packages and everything they depend on, as installed here: of each choice (a | b), the
# first installed.
declare -A chosen=()
queue=("${packages[@]}")
while [ "${#queue[@]}" -gt 0 ]; do
  pkg="${queue[0]}"
  queue=("${queue[@]:1}")
  [ -z "${chosen[$pkg]:-}" ] || continue
  [ -n "${depends[$pkg]:-}" ] ||
    die "Debian package $pkg is not installed on this machine: apt-get install $pkg, then build again"
  chosen[$pkg]=1
  IFS=',' read -ra deps <<<"${depends[$pkg]}"
  for dep in "${deps[@]}"; do
    [ -n "${dep// /}" ] || continue
    pick=""
    IFS='|' read -ra alternatives <<<"$dep"
    for alt in "${alternatives[@]}"; do
      alt="${alt%%(*}"; alt="${alt// /}"; alt="${alt%%:*}"
      if [ -n "${depends[$alt]:-}" ]; then pick="$alt"; break; fi
      if [ -n "${provider[$alt]:-}" ]; then pick="${provider[$alt]}"; break; fi
    done
    [ -n "$pick" ] || die "$pkg depends on $dep, and none of it is installed on this machine"
    queue+=("$pick")
  done
done

# The top-level links of a merged /usr (Debian's layout since bookworm: /lib -> usr/lib), as
# on this machine, so every path a package lists resolves in the image as it does here.
for d in bin sbin lib lib32 lib64 libx32; do
  if [ -L "/$d" ]; then
    ln -s "$(readlink "/$d")" "$rootfs/$d"
    mkdir -p "$rootfs/usr/$d"
  fi
done
# The packages' files as installed here: regular files and symlinks (their directories come
# with them). Documentation and translations are left out.
dpkg-query -L "${!chosen[@]}" |
  grep -Ev '^/usr/share/(doc|man|info|locale|lintian)/' | while read -r f; do
    if [ ! -d "$f" ] && { [ -L "$f" ] || [ -f "$f" ]; }; then printf '%s\n' "${f#/}"; fi
  done | sort -u >"$work/files"
tar -C / --no-recursion -cf - -T "$work/files" | tar -C "$rootfs" -xf -

install -d -m 0755 "$rootfs/usr/local/bin" "$rootfs/etc" "$rootfs/dev" "$rootfs/proc" \
  "$rootfs/sys" "$rootfs/run" "$rootfs/home/farmem"
install -d -m 0700 "$rootfs/root"
install -d -m 1777 "$rootfs/tmp"
install -m 0755 "$farmem" "$rootfs/usr/local/bin/farmem"
install -m 0644 "$preload" "$rootfs/usr/local/bin/libfarmem_preload.so"
cc -O2 -Wall -o "$rootfs/usr/local/bin/farmem-demo" "$here/demo.c"
readelf -l "$rootfs/usr/local/bin/farmem-demo" | grep -q 'program interpreter' ||
  die "the demo was linked statically: farmem needs a dynamically linked program (LD_PRELOAD)"

# Every shared library a program or library of the image links must be in it: a missing one
# would fail only when the container runs.
find "$rootfs" \( -type f -o -type l \) -printf '%f\n' | sort -u >"$work/names"
find "$rootfs" -type f \( -perm -0100 -o -name '*.so' -o -name '*.so.*' \) -print0 |
  # farmem first: readelf names each file ("File: ...") only when given more than one.
  xargs -0 -r readelf -d "$rootfs/usr/local/bin/farmem" 2>/dev/null | awk -v root="$rootfs" '
    /^File: / { file = substr($0, 7); sub("^" root, "", file) }
    /\(NEEDED\)/ { lib = $NF; gsub(/[][]/, "", lib); print file "\t" lib }' >"$work/needed" || true
awk -F'\t' 'NR == FNR { have[$0] = 1; next } !($2 in have) { print $1 " needs " $2 }' \
  "$work/names" "$work/needed" >"$work/missing"
[ ! -s "$work/missing" ] ||
  die "libraries missing from the image (add their packages with --package): $(sort -u "$work/missing" | head -5 | paste -sd';' -)"

cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
farmem:x:1000:1000:farmem:/home/farmem:/usr/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
farmem:x:1000:
EOF
: >"$rootfs/etc/hosts"
: >"$rootfs/etc/resolv.conf"

# Owned by root, except the user's home, whoever builds it.
tar -C "$rootfs" --numeric-owner --owner=0 --group=0 --exclude=./home/farmem -cf "$work/rootfs.tar" .
tar -C "$rootfs" --numeric-owner --owner=1000 --group=1000 -rf "$work/rootfs.tar" ./home/farmem

podman import --quiet \
  --change 'USER farmem' \
  --change 'WORKDIR /home/farmem' \
  --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
  --change 'CMD ["/usr/local/bin/farmem", "--help"]' \
  "$work/rootfs.tar" "$tag" >/dev/null
echo "build-image: built $tag from ${#chosen[@]} Debian packages; farmem, libfarmem_preload.so and farmem-demo in /usr/local/bin; user farmem (uid 1000)"
