// Command etcd is the etcd server of one pinned release, built as a module of its own: etcd's
// go.mod carries replace directives of its own, and sharing a module with Kubernetes would move
// dependencies both of them pin.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
