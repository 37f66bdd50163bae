#!/usr/bin/env bash
# A copy of ../shared/tools/valkey.sh, for a clone without ../shared beside it (.ci/run prefers the original).
# Puts Valkey 8.1 (the first server with `SET ... IFEQ`, a native compare-and-set) on a Debian 12 machine, where
# only Redis 7.0 is packaged: downloads Debian 13's valkey-server and valkey-tools packages and Debian 13's C
# library through apt (a private package list; nothing is installed system-wide) and writes two wrappers that
# run them with that library's loader. Idempotent; about 6 MiB; needs root only for apt's download.
# The Debian 12 libraries it also loads (libjemalloc2, liblzf1, libssl3, libsystemd0) come with `apt-get install -y
# redis-server`.
#   ../shared/tools/valkey.sh [DIR]      # default ~/.cache/idem-valkey; prints DIR/bin
#   DIR/bin/valkey-server --port 6391 --save '' --appendonly no &
#   DIR/bin/valkey-cli -p 6391 SET k b IFEQ a
# Tests can take the server from an environment variable, e.g. IDEM_VALKEY_SERVER=DIR/bin/valkey-server.
set -euo pipefail
dir=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/idem-valkey}
if [ -x "$dir/bin/valkey-server" ] && "$dir/bin/valkey-server" --version >/dev/null 2>&1; then echo "$dir/bin"; exit 0; fi
mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/debs" "$dir/root" "$dir/lib" "$dir/bin"
# the same Debian archive this machine's apt already uses, with the next release's suite
uri=$(grep -hoE '^(URIs:|deb)[[:space:]]+[a-z]+://[^[:space:]]+' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
  2>/dev/null | awk '{print $2}' | grep -v security | head -1 || true)
[ -n "$uri" ] || { echo "valkey.sh: no Debian archive in this machine's apt sources" >&2; exit 1; }
echo "deb $uri trixie main" > "$dir/apt/sources.list"
A=(-o Dir::Etc::sourcelist="$dir/apt/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$dir/apt/lists"
   -o Dir::Cache="$dir/apt/cache" -o APT::Sandbox::User=root -o Debug::NoLocking=1)
apt-get "${A[@]}" -qq update >&2
(cd "$dir/debs" && apt-get "${A[@]}" -qq download valkey-server valkey-tools libc6 >&2)
for d in "$dir"/debs/*.deb; do dpkg-deb -x "$d" "$dir/root"; done
cp -L "$dir"/root/usr/lib/x86_64-linux-gnu/{libc.so.6,libm.so.6,ld-linux-x86-64.so.2} "$dir/lib/"
for b in valkey-server valkey-cli; do
  cat > "$dir/bin/$b" <<SH
#!/usr/bin/env bash
d=\$(cd "\$(dirname "\$0")/.." && pwd)
exec "\$d/lib/ld-linux-x86-64.so.2" --library-path "\$d/lib:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu" "\$d/root/usr/bin/$b" "\$@"
SH
  chmod +x "$dir/bin/$b"
done
rm -rf "$dir/apt" "$dir/debs"
"$dir/bin/valkey-server" --version >&2
echo "$dir/bin"
