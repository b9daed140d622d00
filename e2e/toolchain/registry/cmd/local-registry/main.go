// local-registry is go-containerregistry's OCI registry (pkg/registry, the server of its cmd/registry) bound to a
// loopback address only: cmd/registry listens on "localhost", which may also resolve to ::1, and serves a random
// warning header. It prints `listening on HOST:PORT` once the socket is open (port 0 picks a free one), so a caller
// learns the port without racing for it.
//
// Manifests and tags live in memory; blobs too, or under -blobs when given. The registry ends with the process.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "loopback address to listen on (port 0: a free port)")
	blobs := flag.String("blobs", "", "directory for blobs (default: in memory)")
	quiet := flag.Bool("quiet", false, "no request log")
	flag.Parse()

	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		log.Fatalf("bad -addr %q: %v", *addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		log.Fatalf("refusing -addr %q: only a loopback IP address (127.0.0.0/8, ::1)", *addr)
	}
	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	opts := []registry.Option{registry.WithReferrersSupport(true)}
	if *blobs != "" {
		if err := os.MkdirAll(*blobs, 0o755); err != nil {
			log.Fatal(err)
		}
		opts = append(opts, registry.WithBlobHandler(registry.NewDiskBlobHandler(*blobs)))
	}
	if *quiet {
		opts = append(opts, registry.Logger(log.New(discard{}, "", 0)))
	}
	fmt.Printf("listening on %s\n", listener.Addr())
	s := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: registry.New(opts...)}
	log.Fatal(s.Serve(listener))
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
