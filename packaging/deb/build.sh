#!/usr/bin/env bash
# Builds the modelcache .deb with dpkg-deb (no extra tool needed on
# Debian): packaging/deb/build.sh BINDIR VERSION OUTDIR. A native package:
# the version has no Debian revision, the changelog is changelog.gz.
set -euo pipefail
bindir=$1 version=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
arch=$(dpkg --print-architecture)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/modelcache"
umask 022

install -D -m0755 "$bindir/modelcached" "$root/usr/bin/modelcached"
install -D -m0755 "$bindir/modelctl" "$root/usr/bin/modelctl"
install -D -m0644 "$top/packaging/systemd/modelcached.service" "$root/usr/lib/systemd/system/modelcached.service"
install -D -m0644 "$top/packaging/systemd/modelcached.socket" "$root/usr/lib/systemd/system/modelcached.socket"
install -D -m0644 "$top/packaging/systemd/modelcache.sysusers" "$root/usr/lib/sysusers.d/modelcache.conf"
install -D -m0644 "$top/packaging/systemd/modelcache.tmpfiles" "$root/usr/lib/tmpfiles.d/modelcache.conf"
install -D -m0644 "$here/config.yaml" "$root/etc/modelcached/config.yaml"
install -d -m0755 "$root/etc/modelcached/models.d"
# The completions are the scripts 'modelctl completion SHELL' prints.
install -d -m0755 "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" "$root/usr/share/fish/vendor_completions.d"
"$bindir/modelctl" completion bash > "$root/usr/share/bash-completion/completions/modelctl"
"$bindir/modelctl" completion zsh > "$root/usr/share/zsh/vendor-completions/_modelctl"
"$bindir/modelctl" completion fish > "$root/usr/share/fish/vendor_completions.d/modelctl.fish"
chmod 0644 "$root/usr/share/bash-completion/completions/modelctl" "$root/usr/share/zsh/vendor-completions/_modelctl" "$root/usr/share/fish/vendor_completions.d/modelctl.fish"
install -d -m0755 "$root/usr/share/man/man1" "$root/usr/share/man/man8"
"$bindir/modelctl" man | gzip -9n > "$root/usr/share/man/man1/modelctl.1.gz"
"$bindir/modelcached" --print-man | gzip -9n > "$root/usr/share/man/man8/modelcached.8.gz"
install -D -m0644 "$here/copyright" "$root/usr/share/doc/modelcache/copyright"
date=$(date -R -d "@${SOURCE_DATE_EPOCH:-$(git -C "$top" log -1 --format=%ct 2>/dev/null || date +%s)}")
printf 'modelcache (%s) unstable; urgency=medium\n\n  * Build of %s.\n\n -- modelcache maintainers <maintainers@modelcache.dev>  %s\n' \
  "$version" "$(git -C "$top" rev-parse --short HEAD 2>/dev/null || echo unknown)" "$date" | gzip -9n > "$root/usr/share/doc/modelcache/changelog.gz"
chmod 0644 "$root/usr/share/man/man1/modelctl.1.gz" "$root/usr/share/man/man8/modelcached.8.gz" "$root/usr/share/doc/modelcache/changelog.gz"

install -d -m0755 "$root/DEBIAN"
for s in postinst prerm postrm; do install -m0755 "$here/$s" "$root/DEBIAN/$s"; done
echo /etc/modelcached/config.yaml > "$root/DEBIAN/conffiles"
libc=$(dpkg-query -W -f='${Version}' libc6 | cut -d- -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: modelcache
Version: $version
Architecture: $arch
Maintainer: modelcache maintainers <maintainers@modelcache.dev>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libc6 (>= 2.34), init-system-helpers (>= 1.54~)
Recommends: systemd
Section: utils
Priority: optional
Homepage: https://github.com/modelcache/modelcache
Description: node-local cache of ML model weights and GPU kernel caches
 modelcached keeps a content-addressed, verified store of model weights
 (Hugging Face, S3, OCI, HTTP, local paths) and signed GPU kernel caches on
 a GPU node, so that inference pods start without downloading anything.
 Commits are atomic, identical files are stored once, and least-recently
 used artifacts are evicted under disk pressure but never pinned or in-use
 ones. modelctl is its command-line client.
CONTROL
(cd "$root" && find usr -type f -print0 | sort -z | xargs -0 md5sum > DEBIAN/md5sums)
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums"
mkdir -p "$out"
deb="$out/modelcache_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
