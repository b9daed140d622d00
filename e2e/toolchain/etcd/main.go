// Command etcd runs etcd's own entry point; the wrapper exists only so that
// the server module can be built without its replace directives.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
