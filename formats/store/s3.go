package store

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3 is a Store in an S3 bucket under a key prefix, through minio-go, so it
// works with AWS S3, MinIO, versitygw and other S3-compatible servers that
// implement conditional writes (If-None-Match: * and If-Match on PutObject).
type S3 struct {
	client *minio.Client
	bucket string
	prefix string // "" or ending in "/"
	uri    string
}

var _ Store = (*S3)(nil)
var _ Sweeper = (*S3)(nil)

// S3Options locate and authenticate an S3 endpoint. The zero value is filled
// from the environment by S3OptionsFromEnv.
type S3Options struct {
	// Endpoint is a URL (http:// disables TLS) or host[:port] (TLS).
	Endpoint string
	Region   string
	// Creds defaults to the chain AWS_* variables, MINIO_* variables,
	// ~/.aws/credentials, then instance metadata.
	Creds *credentials.Credentials
	// CABundle is a PEM file of extra trusted roots (AWS_CA_BUNDLE).
	CABundle string
}

// S3OptionsFromEnv reads KILN_S3_ENDPOINT (else AWS_ENDPOINT_URL_S3, else
// AWS_ENDPOINT_URL, else AWS itself), AWS_REGION / AWS_DEFAULT_REGION and
// AWS_CA_BUNDLE.
func S3OptionsFromEnv() S3Options {
	return S3Options{
		Endpoint: firstEnv("KILN_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"),
		Region:   firstEnv("AWS_REGION", "AWS_DEFAULT_REGION"),
		CABundle: os.Getenv("AWS_CA_BUNDLE"),
	}
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// NewS3 opens s3://bucket/prefix. It does not contact the server.
func NewS3(uri string, opts S3Options) (*S3, error) {
	u, err := url.Parse(uri)
	if err == nil && u.User != nil {
		// Refused, not stripped: a URI with a secret in it ends up in
		// sbatch scripts, manifests and logs (issue 31), and kiln never
		// reads credentials from it. The message names the store without
		// its userinfo.
		u.User = nil
		return nil, fmt.Errorf("store %q: a store URI must not carry credentials (KEY:SECRET@): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or use ~/.aws/credentials", u.String())
	}
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return nil, fmt.Errorf("store %q: want s3://bucket/prefix", redactUserinfo(uri))
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		if err := CheckKey(prefix); err != nil {
			return nil, fmt.Errorf("store %q: prefix: %w", uri, err)
		}
		prefix += "/"
	}
	endpoint, secure, lookup := "s3.amazonaws.com", true, minio.BucketLookupAuto
	if opts.Endpoint != "" {
		lookup = minio.BucketLookupPath // custom servers rarely have wildcard DNS
		e := opts.Endpoint
		if strings.Contains(e, "://") {
			eu, err := url.Parse(e)
			if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" {
				return nil, fmt.Errorf("S3 endpoint %q: want http(s)://host[:port] or host[:port]", e)
			}
			e, secure = eu.Host, eu.Scheme == "https"
		}
		endpoint = e
	}
	creds := opts.Creds
	if creds == nil {
		creds = credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{}, &credentials.EnvMinio{},
			&credentials.FileAWSCredentials{}, &credentials.IAM{},
		})
	}
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, err
	}
	tr.MaxIdleConnsPerHost = 64
	if opts.CABundle != "" {
		pem, err := os.ReadFile(opts.CABundle)
		if err != nil {
			return nil, fmt.Errorf("S3 CA bundle: %w", err)
		}
		pool, _ := x509.SystemCertPool()
		if pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("S3 CA bundle %q: no PEM certificates", opts.CABundle)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	c, err := minio.New(endpoint, &minio.Options{
		Creds: creds, Secure: secure, Region: opts.Region,
		BucketLookup: lookup, Transport: tr,
	})
	if err != nil {
		return nil, fmt.Errorf("store %q: %w", uri, err)
	}
	return &S3{client: c, bucket: u.Host, prefix: prefix, uri: "s3://" + u.Host + "/" + strings.TrimSuffix(prefix, "/")}, nil
}

func (s *S3) URI() string { return strings.TrimSuffix(s.uri, "/") }

// Client exposes the underlying client (tests create buckets with it).
func (s *S3) Client() *minio.Client { return s.client }

// Bucket is the bucket name.
func (s *S3) Bucket() string { return s.bucket }

func (s *S3) object(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	return s.prefix + key, nil
}

func (s *S3) info(key string, oi minio.ObjectInfo) Info {
	return Info{Key: key, Size: oi.Size, ETag: strings.Trim(oi.ETag, `"`), ModTime: oi.LastModified}
}

// mapErr turns S3 error codes into the store's sentinel errors.
func (s *S3) mapErr(err error, key string) error {
	if err == nil {
		return nil
	}
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.Code == "NoSuchKey" || resp.StatusCode == http.StatusNotFound && resp.Code != "NoSuchBucket":
		return fmt.Errorf("%q in %s: %w", key, s.URI(), ErrNotExist)
	case resp.Code == "NoSuchBucket":
		return fmt.Errorf("%s: bucket %q does not exist: create it first: %w", s.URI(), s.bucket, err)
	}
	return fmt.Errorf("%q in %s: %w", key, s.URI(), err)
}

func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, Info, error) {
	obj, err := s.object(key)
	if err != nil {
		return nil, Info{}, err
	}
	// One GET through Core, so that Info and bytes come from one response.
	// (Client.GetObject's Stat sends a HEAD, then GETs with If-Match on the
	// first Read, which fails if the object was replaced in between.)
	body, oi, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, obj, minio.GetObjectOptions{})
	if err != nil {
		return nil, Info{}, s.mapErr(err, key)
	}
	return body, s.info(key, oi), nil
}

func (s *S3) GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	obj, err := s.object(key)
	if err != nil {
		return nil, err
	}
	if length == 0 || offset < 0 {
		// No request can express this range: check it as Local does.
		info, err := s.Stat(ctx, key)
		if err != nil {
			return nil, err
		}
		if offset < 0 || offset > info.Size || (offset == info.Size && info.Size > 0) {
			return nil, fmt.Errorf("range at %d of %q in %s: object has %d bytes", offset, key, s.URI(), info.Size)
		}
		return io.NopCloser(strings.NewReader("")), nil
	}
	var opts minio.GetObjectOptions
	end := int64(0) // minio: SetRange(off, 0) = from off to the end
	if length > 0 {
		end = offset + length - 1
	}
	if err := opts.SetRange(offset, end); err != nil {
		return nil, fmt.Errorf("range of %q: %w", key, err)
	}
	if offset == 0 && length < 0 {
		opts = minio.GetObjectOptions{}
	}
	body, _, _, err := minio.Core{Client: s.client}.GetObject(ctx, s.bucket, obj, opts)
	if offset == 0 && minio.ToErrorResponse(err).Code == minio.InvalidRange {
		// S3 refuses any range of an empty object; offset 0 is not beyond its end.
		if info, serr := s.Stat(ctx, key); serr == nil && info.Size == 0 {
			return io.NopCloser(strings.NewReader("")), nil
		}
	}
	if err != nil {
		return nil, s.mapErr(err, key)
	}
	return body, nil
}

func (s *S3) Stat(ctx context.Context, key string) (Info, error) {
	obj, err := s.object(key)
	if err != nil {
		return Info{}, err
	}
	oi, err := s.client.StatObject(ctx, s.bucket, obj, minio.StatObjectOptions{})
	if err != nil {
		return Info{}, s.mapErr(err, key)
	}
	return s.info(key, oi), nil
}

// s3PartSize is the multipart part size, and the largest single PUT. Tests
// lower it (export_test.go).
var s3PartSize int64 = 64 << 20

// s3SizedPartSize is the part size of an unconditional write of known size
// above s3PartSize (grown when 10000 parts would not hold the object).
// minio-go buffers one part per upload, and writers upload several big
// files at once (kiln-sync publish: up to 8), so the part is what bounds
// their memory: 4 uploads of 2 GiB files held 4 × 64 MiB. Parts of 16 MiB
// are within what S3 recommends (8-16 MiB), and on versitygw over loopback
// a full publish of 8 GiB is as fast with them (stages/sync BenchmarkSync).
const s3SizedPartSize = 16 << 20

// growPartsAfter is the number of parts of s3SizedPartSize an upload of
// unknown size sends before its parts grow to s3PartSize (putParts).
const growPartsAfter = 64

// sizedPartSize is the part size of an unconditional write of size bytes
// (size > s3PartSize): s3SizedPartSize, or s3PartSize if that is smaller
// (tests), rounded up to whole MiB so 10000 parts hold the object.
func sizedPartSize(size int64) int64 {
	part := min(s3SizedPartSize, s3PartSize)
	const maxParts = 10000
	if need := (size + maxParts - 1) / maxParts; need > part {
		part = (need + 1<<20 - 1) &^ (1<<20 - 1)
	}
	return part
}

// put writes the object. conditional says opts carries If-Match or
// If-None-Match.
func (s *S3) put(ctx context.Context, key string, r io.Reader, size int64, opts minio.PutObjectOptions, conditional bool) (Info, error) {
	obj, err := s.object(key)
	if err != nil {
		return Info{}, err
	}
	opts.ContentType = "application/octet-stream"
	opts.PartSize = uint64(s3PartSize)
	opts.DisableContentSha256 = true // TLS or the store's own sha256 protect content
	switch {
	case size >= 0 && size <= s3PartSize:
		// A single PUT: make sure of the size before sending anything. minio
		// silently sends only the first size bytes of a longer io.ReaderAt,
		// and a body that ends early is not refused by every server
		// (versitygw stores what arrived before the disconnect).
		if r, err = exactBody(ctx, key, r, size); err != nil {
			return Info{}, err
		}
	case size > s3PartSize:
		r = &sizedReader{r: r, left: size, key: key} // parts are buffered before they are sent
		if !conditional {
			opts.PartSize = uint64(sizedPartSize(size))
		}
	}
	var ui minio.UploadInfo
	if size < 0 || (conditional && size > s3PartSize) {
		ui, err = s.putParts(ctx, obj, r, opts)
	} else {
		ui, err = s.client.PutObject(ctx, s.bucket, obj, r, size, opts)
	}
	if err != nil {
		return Info{}, err
	}
	if size >= 0 && ui.Size != size {
		return Info{}, fmt.Errorf("writing %q: stored %d bytes, want %d", key, ui.Size, size)
	}
	// PutObject's reply has no Last-Modified; the store's clock is
	// authoritative. The ETag is the reply's: by the time of the Stat another
	// writer may have replaced the object, and handing its ETag to our caller
	// would let a later PutIfMatch overwrite an update it never saw.
	info, err := s.Stat(ctx, key)
	etag := strings.Trim(ui.ETag, `"`)
	if err != nil || (etag != "" && info.ETag != etag) {
		return Info{Key: key, Size: ui.Size, ETag: etag, ModTime: info.ModTime}, nil
	}
	return info, nil
}

// exactBody returns a reader of exactly size bytes from r, which must hold
// exactly that many, without consuming more than size+1 bytes of it. An
// io.ReaderAt with an io.Seeker is measured; other readers are buffered.
func exactBody(ctx context.Context, key string, r io.Reader, size int64) (io.Reader, error) {
	if ra, ok := r.(interface {
		io.ReaderAt
		io.Seeker
	}); ok {
		cur, err := ra.Seek(0, io.SeekCurrent)
		if err == nil {
			var end int64
			if end, err = ra.Seek(0, io.SeekEnd); err == nil {
				_, err = ra.Seek(cur, io.SeekStart)
			}
			if err == nil && end-cur != size {
				return nil, fmt.Errorf("writing %q: reader has %d bytes, want %d", key, end-cur, size)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("writing %q: %w", key, err)
		}
		return io.NewSectionReader(ra, cur, size), nil
	}
	buf := make([]byte, size)
	if n, err := io.ReadFull(ctxReader{ctx, r}, buf); err == io.EOF || err == io.ErrUnexpectedEOF {
		return nil, fmt.Errorf("writing %q: got %d bytes, want %d", key, n, size)
	} else if err != nil {
		return nil, fmt.Errorf("writing %q: %w", key, err)
	}
	var probe [1]byte
	if n, err := io.ReadFull(r, probe[:]); n > 0 {
		return nil, fmt.Errorf("writing %q: got more than %d bytes", key, size)
	} else if err != io.EOF {
		return nil, fmt.Errorf("writing %q: %w", key, err)
	}
	return bytes.NewReader(buf), nil
}

// sizedReader fails unless r yields exactly left bytes. It reports extra
// bytes before handing over the last expected ones.
type sizedReader struct {
	r    io.Reader
	left int64
	key  string
}

func (s *sizedReader) Read(p []byte) (int, error) {
	if s.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > s.left {
		p = p[:s.left]
	}
	n, err := s.r.Read(p)
	s.left -= int64(n)
	if s.left == 0 {
		var probe [1]byte
		if m, perr := io.ReadFull(s.r, probe[:]); m > 0 {
			return 0, fmt.Errorf("writing %q: reader has more bytes than its size", s.key)
		} else if perr != io.EOF {
			return 0, fmt.Errorf("writing %q: %w", s.key, perr)
		}
		return n, io.EOF
	}
	if err == io.EOF {
		return n, fmt.Errorf("writing %q: reader ended %d bytes short: %w", s.key, s.left, io.ErrUnexpectedEOF)
	}
	return n, err
}

// putParts writes r as a multipart upload through minio.Core so that the
// condition in opts goes with CompleteMultipartUpload. minio-go's PutObject
// sends it only with CreateMultipartUpload, where S3 ignores it, which made
// PutIfAbsent and PutIfMatch of unknown-size or big objects unconditional.
// Unconditional writes of unknown size come here too (opts then has no
// condition), for the part sizes: the first growPartsAfter parts are of
// s3SizedPartSize, the rest of s3PartSize, so an object up to 1 GiB holds
// a 16 MiB buffer, not minio-go's 64 MiB (kiln-sync's packs, dataset
// shards), and 10000 parts still hold 621 GiB. An object that fits in its
// first part goes in a single PUT.
func (s *S3) putParts(ctx context.Context, obj string, r io.Reader, opts minio.PutObjectOptions) (minio.UploadInfo, error) {
	first := min(s3SizedPartSize, s3PartSize)
	// Small objects (pointers, manifests) do not get a whole part's buffer.
	buf, err := io.ReadAll(io.LimitReader(ctxReader{ctx, r}, first))
	if err != nil {
		return minio.UploadInfo{}, err
	}
	if int64(len(buf)) < first {
		return s.client.PutObject(ctx, s.bucket, obj, bytes.NewReader(buf), int64(len(buf)), opts)
	}
	n := len(buf)
	core := minio.Core{Client: s.client}
	id, err := core.NewMultipartUpload(ctx, s.bucket, obj, minio.PutObjectOptions{ContentType: opts.ContentType})
	if err != nil {
		return minio.UploadInfo{}, err
	}
	ui, err := func() (minio.UploadInfo, error) {
		var parts []minio.CompletePart
		var total int64
		for num := 1; n > 0; num++ {
			p, err := core.PutObjectPart(ctx, s.bucket, obj, id, num, bytes.NewReader(buf[:n]), int64(n),
				minio.PutObjectPartOptions{DisableContentSha256: true})
			if err != nil {
				return minio.UploadInfo{}, err
			}
			parts = append(parts, minio.CompletePart{PartNumber: num, ETag: p.ETag})
			total += int64(n)
			if num == growPartsAfter && int64(len(buf)) < s3PartSize {
				buf = make([]byte, s3PartSize)
			}
			n, err = io.ReadFull(ctxReader{ctx, r}, buf)
			if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
				return minio.UploadInfo{}, err
			}
		}
		ui, err := core.CompleteMultipartUpload(ctx, s.bucket, obj, id, parts, opts)
		ui.Size = total
		return ui, err
	}()
	if err != nil {
		// Clean up even if ctx was cancelled; what remains is a leftover.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_ = core.AbortMultipartUpload(actx, s.bucket, obj, id)
		return minio.UploadInfo{}, err
	}
	return ui, nil
}

func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) (Info, error) {
	info, err := s.put(ctx, key, r, size, minio.PutObjectOptions{}, false)
	if err != nil {
		return Info{}, s.mapErr(err, key)
	}
	return info, nil
}

func (s *S3) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) (Info, error) {
	var opts minio.PutObjectOptions
	opts.SetMatchETagExcept("*")
	info, err := s.put(ctx, key, r, size, opts, true)
	if isPrecondition(err) {
		return Info{}, fmt.Errorf("%q in %s: %w", key, s.URI(), ErrExist)
	}
	if err != nil {
		return Info{}, s.mapErr(err, key)
	}
	return info, nil
}

func (s *S3) PutIfMatch(ctx context.Context, key string, r io.Reader, size int64, etag string) (Info, error) {
	if etag == "" || etag == "*" {
		// No object has these ETags, but If-Match: * matches any object, and
		// some servers (versitygw) take If-Match: "" for no condition at all.
		if _, err := s.object(key); err != nil {
			return Info{}, err
		}
		return Info{}, fmt.Errorf("%q in %s: no object has ETag %q: %w", key, s.URI(), etag, ErrPrecondition)
	}
	var opts minio.PutObjectOptions
	opts.SetMatchETag(etag)
	info, err := s.put(ctx, key, r, size, opts, true)
	if isPrecondition(err) || errors.Is(s.mapErr(err, key), ErrNotExist) {
		return Info{}, fmt.Errorf("%q in %s: %w", key, s.URI(), ErrPrecondition)
	}
	if err != nil {
		return Info{}, s.mapErr(err, key)
	}
	return info, nil
}

// isPrecondition: 412, or 409 ConditionalRequestConflict (another conditional
// write of the same key was in flight and won).
func isPrecondition(err error) bool {
	if err == nil {
		return false
	}
	resp := minio.ToErrorResponse(err)
	return resp.StatusCode == http.StatusPreconditionFailed || resp.Code == "PreconditionFailed" ||
		resp.Code == "ConditionalRequestConflict"
}

func (s *S3) Delete(ctx context.Context, key string) error {
	obj, err := s.object(key)
	if err != nil {
		return err
	}
	err = s.client.RemoveObject(ctx, s.bucket, obj, minio.RemoveObjectOptions{})
	if err != nil && !errors.Is(s.mapErr(err, key), ErrNotExist) {
		return s.mapErr(err, key)
	}
	return nil
}

func (s *S3) List(ctx context.Context, prefix string, fn func(Info) error) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing goroutine when fn fails
	for oi := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if oi.Err != nil {
			return s.mapErr(oi.Err, prefix)
		}
		key := strings.TrimPrefix(oi.Key, s.prefix)
		if strings.HasSuffix(key, "/") {
			continue // directory markers some servers report
		}
		if err := fn(s.info(key, oi)); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// Leftovers reports incomplete multipart uploads of writers that died.
func (s *S3) Leftovers(ctx context.Context, olderThan time.Time, fn func(Info) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for u := range s.client.ListIncompleteUploads(ctx, s.bucket, s.prefix, true) {
		if u.Err != nil {
			return fmt.Errorf("listing incomplete uploads in %s: %w", s.URI(), u.Err)
		}
		if !u.Initiated.Before(olderThan) {
			continue
		}
		if err := fn(Info{Key: strings.TrimPrefix(u.Key, s.prefix), Size: u.Size, ModTime: u.Initiated, ETag: "upload:" + u.UploadID}); err != nil {
			return err
		}
	}
	return nil
}

func (s *S3) RemoveLeftover(ctx context.Context, leftover Info) error {
	id, ok := strings.CutPrefix(leftover.ETag, "upload:")
	if !ok || id == "" {
		return fmt.Errorf("not a leftover of %s: %q (ETag %q)", s.URI(), leftover.Key, leftover.ETag)
	}
	// Abort only the upload reported: RemoveIncompleteUpload would abort
	// every upload of the key, including a live writer's newer one.
	err := minio.Core{Client: s.client}.AbortMultipartUpload(ctx, s.bucket, s.prefix+leftover.Key, id)
	if minio.ToErrorResponse(err).Code == "NoSuchUpload" {
		return nil
	}
	return err
}

// redactUserinfo drops anything between "://" and an "@" before the first
// "/" of a URI that did not parse, so an error never repeats a secret.
func redactUserinfo(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return uri
	}
	host, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(host, "@"); i >= 0 {
		host = "REDACTED@" + host[i+1:]
	}
	if path != "" || strings.Contains(rest, "/") {
		return scheme + "://" + host + "/" + path
	}
	return scheme + "://" + host
}
