// The pause program of the test nodes' sandbox image: the standard library only, so there is no
// go.sum (`go mod tidy` writes none; build.sh builds it with -mod=readonly).
module ipkeep.dev/e2e/cluster/pause

go 1.24.0
