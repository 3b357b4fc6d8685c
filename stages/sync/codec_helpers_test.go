package sync

import "strconv"

// encodePayload is codec.encode with a codec made for the call: for one-off
// use and tests; loops reuse one codec.
func encodePayload(enc string, old, new []byte) ([]byte, error) {
	c, err := newCodec()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.encode(enc, old, new)
}

// applyPayload is codec.apply with a codec made for the call.
func applyPayload(enc string, dst []byte, frame []byte) error {
	c, err := newCodec()
	if err != nil {
		return err
	}
	defer c.Close()
	return c.apply(enc, dst, frame)
}

// versionNumber is the weights number a version directory's name starts
// with (-1 when the name is not of versionDirName's form).
func versionNumber(name string) int64 {
	m := versionDirRE.FindStringSubmatch(name)
	if m == nil {
		return -1
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return -1
	}
	return n
}
