#!/usr/bin/env bash
# Builds the container image of the sidecar (`ratelimit`, with `ratelimit-client` and
# `ratelimit-config-check`) or of the intake (`operations-intake`) from binaries built
# in this workspace, on an empty base (`FROM scratch`): no base image is pulled.
#
#   deploy/image/build.sh ratelimit|operations-intake [TAG]
#
# It assembles the image's root filesystem in a temporary build context (the stripped
# binaries, the shared libraries `ldd` lists for them, a passwd entry for the non-root
# user 65532, the system's CA bundle and an empty /tmp), then runs
# `$CONTAINER_TOOL build` (podman by default; docker and buildah take the same
# arguments) on deploy/image/<name>.Containerfile.
#
# Every variable is optional: a local build needs none.
#   BIN_DIR         where the binaries are (default: target/release; build them first
#                   with `cargo build --release -p ratelimit-sidecar` or
#                   `-p operations-intake`)
#   CONTAINER_TOOL  podman (default), docker or buildah
#   IMAGE_SOURCE    the repository's address, written in the image's
#                   org.opencontainers.image.source label for whoever inspects it
#                   (default: the URL of the git remote `origin`, without any user or
#                   password in it; empty when there is no such remote; set it empty
#                   for an empty label)
#   KEEP_CONTEXT    a directory to keep the build context in, instead of a temporary one
set -euo pipefail
usage="usage: deploy/image/build.sh ratelimit|operations-intake [TAG]"
name="${1:?$usage}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
case "$name" in
ratelimit) binaries=(ratelimit ratelimit-client ratelimit-config-check) ;;
operations-intake) binaries=(operations-intake) ;;
*)
	echo "$usage" >&2
	exit 2
	;;
esac
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)"
license="$(sed -n 's/^license = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)"
tag="${2:-$name:$version}"
bin_dir="${BIN_DIR:-$root/target/release}"
tool="${CONTAINER_TOOL:-podman}"
if [ -n "${IMAGE_SOURCE+set}" ]; then
	source="$IMAGE_SOURCE"
else
	# A remote's URL can carry credentials (https://user:token@host/...): not in a label.
	source="$(git -C "$root" config --get remote.origin.url 2>/dev/null | sed -E 's#^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@#\1#' || true)"
fi

if [ -n "${KEEP_CONTEXT:-}" ]; then
	context="$KEEP_CONTEXT"
	rm -rf "$context/rootfs"
	mkdir -p "$context"
else
	context="$(mktemp -d)"
	trap 'rm -rf "$context"' EXIT
fi
rootfs="$context/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/etc/ssl/certs" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
for binary in "${binaries[@]}"; do
	if [ ! -x "$bin_dir/$binary" ]; then
		echo "$bin_dir/$binary is missing: build it first (cargo build --release), or set BIN_DIR" >&2
		exit 1
	fi
	strip -o "$rootfs/bin/$binary" "$bin_dir/$binary"
	# Every shared library the binary loads, and the loader, at the paths it names them by.
	ldd "$bin_dir/$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
		while read -r library; do
			cp --dereference --parents "$library" "$rootfs"
		done
done
printf 'root:x:0:0:root:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$rootfs/etc/hosts"
# Roots for TLS to Redis, memcached, an xDS server or a trace collector that use public CAs.
if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
	cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
fi

"$tool" build \
	--file "$here/$name.Containerfile" \
	--build-arg "VERSION=$version" \
	--build-arg "SOURCE=$source" \
	--build-arg "LICENSE=$license" \
	--tag "$tag" \
	"$context"
