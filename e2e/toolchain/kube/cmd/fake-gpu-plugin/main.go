// Command fake-gpu-plugin advertises NVIDIA GPUs that do not exist to one kubelet, through the
// kubelet's own device-plugin API, so that the kubelet's allocation (not a test's bookkeeping)
// decides how many GPU pods fit on a node.
//
// It registers through the kubelet's plugin watcher: one unix socket in the kubelet's
// `<root-dir>/plugins_registry` serves both the registration service (GetInfo says "a
// DevicePlugin for nvidia.com/gpu", endpoint = this socket) and the DevicePlugin service. The
// watcher path is per kubelet root directory, so two kubelets on one machine each see only their
// own plugin (the legacy /var/lib/kubelet/device-plugins/kubelet.sock is a fixed path).
//
// Devices are named `<prefix>-gpu<i>` and always Healthy; Allocate hands a container the IDs in
// NVIDIA_VISIBLE_DEVICES, as NVIDIA's plugin does. Nothing here touches a real device.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	reg "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type plugin struct {
	dp.UnimplementedDevicePluginServer
	reg.UnimplementedRegistrationServer
	resource string
	devices  []*dp.Device
	stop     chan struct{}
}

// GetInfo answers the kubelet's plugin watcher: a device plugin for one resource, served here.
func (p *plugin) GetInfo(context.Context, *reg.InfoRequest) (*reg.PluginInfo, error) {
	return &reg.PluginInfo{Type: reg.DevicePlugin, Name: p.resource, SupportedVersions: []string{dp.Version}}, nil
}

func (p *plugin) NotifyRegistrationStatus(_ context.Context, s *reg.RegistrationStatus) (*reg.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		log.Printf("Registered with the kubelet resource=%s devices=%d", p.resource, len(p.devices))
	} else {
		log.Printf("Registration refused by the kubelet resource=%s error=%q", p.resource, s.Error)
	}
	return &reg.RegistrationStatusResponse{}, nil
}

func (p *plugin) GetDevicePluginOptions(context.Context, *dp.Empty) (*dp.DevicePluginOptions, error) {
	return &dp.DevicePluginOptions{}, nil
}

// ListAndWatch sends the device list once; the devices never change, so the stream then waits.
func (p *plugin) ListAndWatch(_ *dp.Empty, stream dp.DevicePlugin_ListAndWatchServer) error {
	if err := stream.Send(&dp.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	select {
	case <-stream.Context().Done():
	case <-p.stop:
	}
	return nil
}

func (p *plugin) Allocate(_ context.Context, req *dp.AllocateRequest) (*dp.AllocateResponse, error) {
	resp := &dp.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		log.Printf("Allocated devices=%s", strings.Join(deviceIDs(c), ","))
		resp.ContainerResponses = append(resp.ContainerResponses, &dp.ContainerAllocateResponse{
			Envs: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(deviceIDs(c), ",")},
		})
	}
	return resp, nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *dp.PreferredAllocationRequest) (*dp.PreferredAllocationResponse, error) {
	return &dp.PreferredAllocationResponse{}, nil
}

func (p *plugin) PreStartContainer(context.Context, *dp.PreStartContainerRequest) (*dp.PreStartContainerResponse, error) {
	return &dp.PreStartContainerResponse{}, nil
}

func main() {
	registry := flag.String("registry-dir", "", "the kubelet's plugins_registry directory (<root-dir>/plugins_registry)")
	resource := flag.String("resource", "nvidia.com/gpu", "extended resource name to advertise")
	count := flag.Int("count", 4, "number of devices")
	prefix := flag.String("prefix", "fake", "device ID prefix (the node name keeps IDs unique per machine)")
	flag.Parse()
	if *registry == "" || *count < 0 {
		fmt.Fprintln(os.Stderr, "usage: fake-gpu-plugin --registry-dir DIR [--resource R] [--count N] [--prefix P]")
		os.Exit(2)
	}
	p := &plugin{resource: *resource, stop: make(chan struct{})}
	for i := 0; i < *count; i++ {
		p.devices = append(p.devices, &dp.Device{ID: fmt.Sprintf("%s-gpu%d", *prefix, i), Health: dp.Healthy})
	}
	if err := os.MkdirAll(*registry, 0o750); err != nil {
		log.Fatalf("Failed to create the registry directory: %v", err)
	}
	sock := filepath.Join(*registry, "triton-fake-gpu.sock")
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatalf("Failed to listen socket=%s: %v", sock, err)
	}
	srv := grpc.NewServer()
	reg.RegisterRegistrationServer(srv, p)
	dp.RegisterDevicePluginServer(srv, p)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		close(p.stop)
		srv.Stop()
	}()
	log.Printf("Serving socket=%s resource=%s devices=%d", sock, *resource, *count)
	if err := srv.Serve(ln); err != nil {
		log.Printf("Stopped serving: %v", err)
	}
	_ = os.Remove(sock)
}
