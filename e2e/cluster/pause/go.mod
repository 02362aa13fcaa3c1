// The pause program of the test nodes' sandbox image: the standard library only, so its go.sum is
// empty and must stay so (build.sh builds it with -mod=readonly: a requirement added without its
// checksums fails the build).
module ipkeep.dev/e2e/cluster/pause

go 1.24.0
