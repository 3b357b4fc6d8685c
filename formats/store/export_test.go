package store

// SetS3PartSize sets the S3 part size (at least 5 MiB) until the returned
// function restores it, so tests reach the multipart paths with small objects.
func SetS3PartSize(n int64) (restore func()) {
	old := s3PartSize
	s3PartSize = n
	return func() { s3PartSize = old }
}

// SizedPartSize is the part size of an unconditional write of size bytes.
var SizedPartSize = sizedPartSize
