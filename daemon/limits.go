package daemon

import "github.com/modelcache/modelcache/api"

// checkURISizes refuses a desire whose source, or a kernel cache's, is
// longer than api.MaxURIBytes, naming the cap (validateDesire: the
// socket, models.d and the cluster alike).
func checkURISizes(ds api.Desire) error {
	uris := []string{ds.URI}
	for _, kc := range ds.KernelCaches {
		uris = append(uris, kc.URI)
	}
	for _, u := range uris {
		if len(u) > api.MaxURIBytes {
			return api.Errorf(api.CodeInvalid, "artifact %s: a source URI of %d bytes; the cap is %d bytes (8 KiB, api.MaxURIBytes)", ds.Name, len(u), api.MaxURIBytes)
		}
	}
	return nil
}
