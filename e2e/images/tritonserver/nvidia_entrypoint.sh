#!/bin/sh
# As NGC's entrypoint, less the banner: run the command given, or a shell.
[ "$#" -gt 0 ] || set -- /bin/bash
exec "$@"
