// istio-bootstrap writes the Envoy bootstrap Istio's agent (pilot-agent)
// would write for a proxy, by the same calls the agent makes: the proxy
// config from a mesh config file (pilot-agent's ConstructProxyConfig), the
// node metadata (bootstrap.GetNodeMetaData) and Istio's bootstrap template
// rendered with them (bootstrap.New(...).WriteTo). Built inside Istio's own
// source tree by `make tools-istiod`; the e2e suite takes its stats_config.
//
//	istio-bootstrap <mesh config file> <bootstrap template> <node id> <instance ip> <output>
//
// (Istio's log goes to stdout, so the bootstrap goes to a file.)
package main

import (
	"fmt"
	"os"

	"istio.io/istio/pilot/cmd/pilot-agent/config"
	"istio.io/istio/pkg/bootstrap"
	"istio.io/istio/pkg/bootstrap/platform"
)

func main() {
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: istio-bootstrap <mesh config> <template> <node id> <instance ip> <output>")
		os.Exit(2)
	}
	mesh, template, id, ip, output := os.Args[1], os.Args[2], os.Args[3], os.Args[4], os.Args[5]
	proxyConfig, err := config.ConstructProxyConfig(mesh, "istio-proxy", "", 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy config:", err)
		os.Exit(1)
	}
	node, err := bootstrap.GetNodeMetaData(bootstrap.MetadataOptions{
		ID:          id,
		Envs:        os.Environ(),
		Platform:    &platform.Unknown{},
		InstanceIPs: []string{ip},
		ProxyConfig: proxyConfig,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "node metadata:", err)
		os.Exit(1)
	}
	out, err := os.Create(output)
	if err != nil {
		fmt.Fprintln(os.Stderr, "output:", err)
		os.Exit(1)
	}
	if err := bootstrap.New(bootstrap.Config{Node: node}).WriteTo(template, out); err != nil {
		fmt.Fprintln(os.Stderr, "bootstrap:", err)
		os.Exit(1)
	}
	if err := out.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "output:", err)
		os.Exit(1)
	}
}
