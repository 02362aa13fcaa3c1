// The pause program of the test nodes' sandbox image: the standard library only.
module ipkeep.dev/e2e/cluster/pause

go 1.24.0
