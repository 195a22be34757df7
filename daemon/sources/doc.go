// Package sources is where a desire's bytes come from: the shared fetcher
// of each scheme, fetchers made with a desire's credentials (a
// ModelCache's Secret, a models.d credentialsFile), the cluster's
// credentials in memory, and who a file:// source is read as. The daemon
// fills a Config from its own and asks a Set; the package links nothing
// of the daemon.
//
// Where to find what, by file:
//
//	sources.go     Set and Config: the shared fetchers, fetchers made with
//	               credentials, the cluster's credentials
//	access.go      the origins of desires, who a file:// source reads as, the
//	               checks of a local source before a desire is persisted
//	credentials.go a credentials file: its keys, its parser, errors that show
//	               no value
package sources
