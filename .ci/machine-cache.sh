# Sourced by .ci/run and .ci/node-lts-checkout.sh: where this machine keeps what CI compiles or
# downloads once and can take again in any later clone, each thing under a name that says exactly
# what it is (package version, Node's ABI, platform). Nothing in it is needed: a machine without it
# compiles and downloads, as a fresh machine must, and fills it for the next run.
#
#   better-sqlite3 for the machine's Node (prebuilds/): better-sqlite3's installer, prebuild-install,
#     takes a binary from a folder named by npm_config_better_sqlite3_local_prebuilds before it
#     would download one or compile; .ci/run puts the one npm ci compiled there.
#   Node LTS, its headers and better-sqlite3 for it (node-lts/): .ci/node-lts-checkout.sh.
#
# CI_MACHINE_CACHE moves it; removing it costs the next run its compiles.
CI_MACHINE_CACHE="${CI_MACHINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/satellite-webhooks-ci}"
