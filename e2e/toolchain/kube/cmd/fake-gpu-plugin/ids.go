package main

import dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

// deviceIDs: the devices a container asks for. The generated field is named DevicesIds in k8s.io/kubelet v0.35
// (each toolchain module has its own copy of this file; main.go is shared).
func deviceIDs(c *dp.ContainerAllocateRequest) []string { return c.DevicesIds }
