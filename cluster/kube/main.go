// Command kube links the three control-plane components of one Kubernetes release into one
// binary, the way k3s does, so that they share one build: `kube apiserver|controller-manager|
// scheduler|proxy [flags]`.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	commands := map[string]func() *cobra.Command{
		"apiserver":          apiserver.NewAPIServerCommand,
		"controller-manager": controllermanager.NewControllerManagerCommand,
		"scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
		"proxy":              proxy.NewProxyCommand,
	}
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		fmt.Fprintln(os.Stderr, "usage: kube apiserver|controller-manager|scheduler|proxy [flags]")
		os.Exit(2)
	}
	command := commands[os.Args[1]]()
	command.SetArgs(os.Args[2:])
	os.Exit(cli.Run(command))
}
