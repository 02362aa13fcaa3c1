// Wrapper module that builds flannel's CNI plugin. Its home today is github.com/flannel-io/cni-plugin,
// which the Go module proxy does not serve; the proxy does serve its last release inside
// github.com/containernetworking/plugins (plugins/meta/flannel, v0.9.1), from which flannel's own
// repository was split in 2021. Kept as its own module because flanneld needs a newer
// containernetworking/plugins, where plugins/meta/flannel no longer exists.
//
// It builds against containernetworking/cni v1.1.2 (it was released against v0.8.1), as
// flannel-io/cni-plugin does: the plugin uses only skel, invoke, types and version, whose API
// did not change, and v1.1.2 speaks CNI 1.0.0, the cniVersion of kube-flannel's conflist (0.8.1
// stops at 0.4.0). `go mod tidy -e`: the plugin's Windows-only helper (pkg/hns) still names
// the pre-1.0 result package; it is never built here.
module ipkeep.dev/e2e/cluster/flannel-cni

go 1.26.0

tool github.com/containernetworking/plugins/plugins/meta/flannel

require (
	github.com/Microsoft/go-winio v0.4.11 // indirect
	github.com/Microsoft/hcsshim v0.8.6 // indirect
	github.com/buger/jsonparser v0.0.0-20180808090653-f4dd9f5a6b44 // indirect
	github.com/containernetworking/cni v1.1.2 // indirect
	github.com/containernetworking/plugins v0.9.1 // indirect
	github.com/sirupsen/logrus v1.0.6 // indirect
	golang.org/x/crypto v0.0.0-20200622213623-75b288015ac9 // indirect
	golang.org/x/sys v0.0.0-20210423082822-04245dca01da // indirect
)
