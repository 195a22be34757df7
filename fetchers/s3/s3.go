// Package s3 fetches from s3://<bucket>/<prefix>: every object under the
// prefix, pinned by a digest of the listing (keys, sizes, ETags, version
// ids), verified by the object's x-amz-checksum-sha256 when it has one and
// by the MD5 of single-part ETags otherwise.
//
// It uses the AWS SDK for Go v2 (github.com/aws/aws-sdk-go-v2): it reads
// the usual configuration (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_PROFILE and the shared config files, IMDS and
// web identity on cloud nodes), signs every request (x-amz-content-sha256
// included, which S3-compatible servers demand) and asks for checksums.
package s3

import (
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/modelcache/modelcache/fetchers"
)

// Fetcher implements fetchers.Fetcher for s3:// URIs. The client is made
// on first use, so a node without AWS configuration pays nothing until it
// pulls from S3. Safe for concurrent use.
type Fetcher struct {
	opts   fetchers.HTTPOptions
	static aws.CredentialsProvider // from WithStaticCredentials; nil: the SDK's chain
	once   sync.Once
	client *s3.Client
	err    error

	// signs caches SendsCredentials' answer for a while (each asks the
	// chain, which may wait on the instance metadata service).
	signsMu sync.Mutex
	signs   bool
	signsAt time.Time
}

type options struct {
	fetchers.HTTPOptions
	static aws.CredentialsProvider
}

// Option configures New.
type Option func(*options)

// WithHTTP sets the shared HTTP options (fetchers.Option): the transport
// (default the SDK's), the redirect policy, and the Range connections of
// one large object (fetchers.WithConnections; default 4). The idle
// timeout and the User-Agent are not read: the SDK sends its own
// User-Agent.
func WithHTTP(opts ...fetchers.Option) Option { return func(o *options) { o.Apply(opts...) } }

// WithStaticCredentials makes the fetcher use these keys (e.g. from a
// Kubernetes Secret) instead of the SDK's credential chain; default the chain.
func WithStaticCredentials(id, secret, session string) Option {
	return func(o *options) { o.static = credentials.NewStaticCredentialsProvider(id, secret, session) }
}

// New returns an S3 fetcher that reads an object on one stream and, for
// objects of at least 4 chunks whose stream is the limit, adds Range
// requests up to the connections of WithHTTP (fetchers.AdaptiveReader).
// S3 limits the throughput of each connection; parallel ranges lift it.
func New(opts ...Option) (*Fetcher, error) {
	o := options{HTTPOptions: fetchers.DefaultHTTPOptions()}
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.CheckRanges(); err != nil {
		return nil, fmt.Errorf("s3: %w", err)
	}
	return &Fetcher{opts: o.HTTPOptions, static: o.static}, nil
}

func (f *Fetcher) s3(ctx context.Context) (*s3.Client, error) {
	f.once.Do(func() {
		cfg, err := config.LoadDefaultConfig(ctx)
		if err != nil {
			f.err = fmt.Errorf("s3: AWS configuration: %w", err)
			return
		}
		if cfg.Region == "" {
			cfg.Region = "us-east-1"
		}
		if f.static != nil {
			cfg.Credentials = f.static
		}
		// The SDK follows 307 and 308 redirects (S3 sends them across
		// regions); they must not lead to a host-internal address.
		if f.opts.Transport != nil {
			cfg.HTTPClient = &http.Client{Transport: f.opts.Guard.Transport(f.opts.Transport, nil), CheckRedirect: checkRedirect}
		} else if bc, ok := cfg.HTTPClient.(*awshttp.BuildableClient); ok {
			cfg.HTTPClient = &http.Client{Transport: f.opts.Guard.Transport(bc.GetTransport(), bc.GetDialer()), CheckRedirect: checkRedirect}
		}
		pathStyle := os.Getenv("AWS_S3_FORCE_PATH_STYLE") == "true"
		if ep := os.Getenv("AWS_ENDPOINT_URL_S3") + os.Getenv("AWS_ENDPOINT_URL"); ep != "" && os.Getenv("AWS_S3_FORCE_PATH_STYLE") != "false" {
			pathStyle = true // S3-compatible servers on an endpoint of their own want path-style addressing
		}
		f.client = s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = pathStyle })
	})
	return f.client, f.err
}

// SendsCredentials reports whether requests are signed with credentials:
// static ones (WithStaticCredentials), or what the SDK's chain finds (the
// environment, a profile, a web identity, the instance's role). It asks
// the chain, bounded to a few seconds, and keeps its answer for ten
// minutes; a chain that finds none sends none.
func (f *Fetcher) SendsCredentials(ctx context.Context, _ string) bool {
	if f.static != nil {
		return true
	}
	f.signsMu.Lock()
	defer f.signsMu.Unlock()
	if !f.signsAt.IsZero() && time.Since(f.signsAt) < 10*time.Minute {
		return f.signs
	}
	c, err := f.s3(ctx)
	if err != nil || c.Options().Credentials == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	creds, err := c.Options().Credentials.Retrieve(ctx)
	f.signs, f.signsAt = err == nil && creds.AccessKeyID != "", time.Now()
	return f.signs
}

// checkRedirect follows only 307 and 308, which keep the method and
// body, as the SDK's own policy (aws/transport/http) does; the rest is
// every fetcher's: at most 10, and no credential (the signature, a
// session token) to another origin (fetchers.DropAuthAcrossOrigins).
func checkRedirect(req *http.Request, via []*http.Request) error {
	if req.Response == nil || (req.Response.StatusCode != http.StatusTemporaryRedirect && req.Response.StatusCode != http.StatusPermanentRedirect) {
		return http.ErrUseLastResponse
	}
	return fetchers.DropAuthAcrossOrigins(req, via)
}

// ParseURI splits s3://bucket/prefix.
func ParseURI(uri string) (bucket, prefix string, err error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return "", "", fmt.Errorf("source %q: %w: write s3://<bucket>/<prefix>", uri, fetchers.ErrBadSource)
	}
	prefix = strings.TrimPrefix(u.Path, "/")
	if strings.Contains("/"+prefix+"/", "/../") {
		return "", "", fmt.Errorf("source %q: %w: '..' in the prefix", uri, fetchers.ErrBadSource)
	}
	return u.Host, prefix, nil
}

// locator carries bucket, key, version id and ETag to Open.
func locator(bucket, key, version, etag string) string {
	return url.Values{"b": {bucket}, "k": {key}, "v": {version}, "e": {etag}}.Encode()
}

// Resolve lists the objects under the prefix and pins the listing.
func (f *Fetcher) Resolve(ctx context.Context, src fetchers.Source) (*fetchers.Resolved, error) {
	bucket, prefix, err := ParseURI(src.URI)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	c, err := f.s3(ctx)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	var objs []types.Object
	p := s3.NewListObjectsV2Paginator(c, &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, explain(bucket, prefix, err)
		}
		objs = append(objs, page.Contents...)
		if len(objs) > 1<<20 {
			return nil, fetchers.Permanent(fmt.Errorf("s3://%s/%s: more than %d objects; narrow the prefix", bucket, prefix, 1<<20))
		}
	}
	// s3://b/models/llama means the objects under models/llama/ (a
	// "directory"), or the one object models/llama; never models/llama2.
	dir := prefix
	if dir != "" && !strings.HasSuffix(dir, "/") {
		dir += "/"
	}
	res := &fetchers.Resolved{URI: src.URI}
	h := sha256.New()
	for _, o := range objs {
		key := aws.ToString(o.Key)
		var rel string
		switch {
		case strings.HasSuffix(key, "/"):
			continue // a directory marker
		case strings.HasPrefix(key, dir):
			rel = strings.TrimPrefix(key, dir)
		case key == prefix:
			rel = path.Base(key)
		default:
			continue
		}
		head, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), ChecksumMode: types.ChecksumModeEnabled})
		if err != nil {
			return nil, explain(bucket, key, err)
		}
		etag := strings.Trim(aws.ToString(head.ETag), `"`)
		fl := fetchers.File{
			Path: rel, Size: aws.ToInt64(head.ContentLength), Mode: 0o644,
			Locator: locator(bucket, key, aws.ToString(head.VersionId), etag), Etag: etag,
		}
		if cs := aws.ToString(head.ChecksumSHA256); cs != "" && !strings.Contains(cs, "-") && head.ChecksumType != types.ChecksumTypeComposite {
			if raw, err := base64.StdEncoding.DecodeString(cs); err == nil && len(raw) == 32 {
				fl.Digest = "sha256:" + hex.EncodeToString(raw)
			}
		}
		if fl.Digest == "" && isMD5(etag) {
			fl.Check = md5Check(etag) // single-part ETag: the MD5 of the bytes
		} // multipart ETags ("<hex>-N") are not an MD5 of the object: the streamed sha256 is recorded
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00%s\n", key, fl.Size, etag, aws.ToString(head.VersionId))
		res.Files = append(res.Files, fl)
	}
	if len(res.Files) == 0 {
		return nil, fetchers.Permanent(fmt.Errorf("s3://%s/%s: %w: no objects under this prefix", bucket, prefix, fetchers.ErrNotFound))
	}
	sort.Slice(res.Files, func(i, j int) bool { return res.Files[i].Path < res.Files[j].Path })
	res.Revision = "s3-" + hex.EncodeToString(h.Sum(nil))[:40]
	return res, nil
}

func isMD5(etag string) bool {
	if len(etag) != 32 {
		return false
	}
	_, err := hex.DecodeString(etag)
	return err == nil
}

func md5Check(etag string) func(io.Reader) error {
	return func(r io.Reader) error {
		h := md5.New()
		if _, err := io.Copy(h, r); err != nil {
			return err
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != etag {
			return fmt.Errorf("MD5 %s, the object's ETag says %s", got, etag)
		}
		return nil
	}
}

// Open streams an object from offset, pinned to the version (or ETag)
// seen at Resolve: an object replaced since fails instead of mixing bytes.
func (f *Fetcher) Open(ctx context.Context, file fetchers.File, offset int64) (io.ReadCloser, error) {
	q, err := url.ParseQuery(file.Locator)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	c, err := f.s3(ctx)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	// The SDK validates a whole object's body against its stored checksum
	// (SHA256 too) when it may; where that checksum is the file's Digest,
	// the store hashes every byte against it anyway, so the SDK does not
	// hash them a second time. Other checksums (CRCs) it still checks.
	noSecondHash := func(*s3.Options) {}
	if file.Digest != "" {
		noSecondHash = func(o *s3.Options) { o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired }
	}
	get := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		in := &s3.GetObjectInput{Bucket: aws.String(q.Get("b")), Key: aws.String(q.Get("k"))}
		if v := q.Get("v"); v != "" && v != "null" {
			in.VersionId = aws.String(v)
		} else if e := q.Get("e"); e != "" {
			in.IfMatch = aws.String(`"` + e + `"`)
		}
		switch {
		case n >= 0:
			in.Range = aws.String("bytes=" + strconv.FormatInt(off, 10) + "-" + strconv.FormatInt(off+n-1, 10))
		case off > 0:
			in.Range = aws.String("bytes=" + strconv.FormatInt(off, 10) + "-")
		}
		out, err := c.GetObject(ctx, in, noSecondHash)
		if err != nil {
			return nil, explain(q.Get("b"), q.Get("k"), err)
		}
		return out.Body, nil
	}
	return fetchers.AdaptiveReader(ctx, f.opts.Ranged(get, file.Size, fetchers.DefaultBackoff), offset)
}

// explain names the bucket and key and says what to do; throttling and
// server errors stay retryable.
func explain(bucket, key string, err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchBucket":
			return fetchers.Permanent(fmt.Errorf("s3://%s: %w: no such bucket (check the name and AWS_ENDPOINT_URL/AWS_REGION)", bucket, fetchers.ErrNotFound))
		case "NoSuchKey", "NotFound":
			return fetchers.Permanent(fmt.Errorf("s3://%s/%s: %w: no such key", bucket, key, fetchers.ErrNotFound))
		case "AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch":
			return fetchers.Permanent(fmt.Errorf("s3://%s/%s: %w (%s): check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the profile, and the bucket policy", bucket, key, fetchers.ErrUnauthorized, ae.ErrorCode()))
		case "PreconditionFailed":
			return fetchers.Permanent(fmt.Errorf("s3://%s/%s: the object changed since the listing; pull again to pin the new one", bucket, key))
		}
	}
	return fmt.Errorf("s3://%s/%s: %w", bucket, key, err)
}
