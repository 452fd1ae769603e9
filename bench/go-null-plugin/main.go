// The benchmark baseline: an NRI plugin that does nothing, on containerd's
// own Go stub (github.com/containerd/nri/pkg/stub, Debian's
// golang-github-containerd-nri-dev).  It subscribes to CreateContainer only
// and answers it empty, so a CRI CreateContainer measured with it running
// shows what the upstream plugin machinery alone adds.  Not part of the
// product; built offline by build.sh.
package main

import (
	"context"
	"flag"
	"log"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type nullPlugin struct{}

func (nullPlugin) CreateContainer(_ context.Context, _ *api.PodSandbox, _ *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	return nil, nil, nil
}

func main() {
	socket := flag.String("socket", "/var/run/nri/nri.sock", "containerd's NRI socket")
	name := flag.String("name", "gonull", "plugin name")
	idx := flag.String("idx", "10", "plugin index (two digits)")
	flag.Parse()

	s, err := stub.New(nullPlugin{},
		stub.WithSocketPath(*socket), stub.WithPluginName(*name), stub.WithPluginIdx(*idx))
	if err != nil {
		log.Fatalf("cannot create the stub: %v", err)
	}
	if err := s.Run(context.Background()); err != nil {
		log.Fatalf("plugin exited: %v", err)
	}
}
