package httpwire

import "bytes"

// SplitAbsoluteForm splits an absolute-form request target
// ("http://api.stripe.com:8080/v1/charges?x=1") into its scheme (lower
// case is not enforced), authority and origin-form rest ("/v1/charges?x=1";
// "/" when the path is empty, "/?q" when only a query follows). ok is false
// when uri is not absolute-form or the scheme is not http or https.
func SplitAbsoluteForm(uri []byte) (scheme, authority, origin []byte, ok bool) {
	i := bytes.Index(uri, []byte("://"))
	if i <= 0 {
		return nil, nil, nil, false
	}
	scheme = uri[:i]
	if !equalFold(scheme, "http") && !equalFold(scheme, "https") {
		return nil, nil, nil, false
	}
	rest := uri[i+3:]
	end := len(rest)
	for j, c := range rest {
		if c == '/' || c == '?' || c == '#' {
			end = j
			break
		}
	}
	authority, origin = rest[:end], rest[end:]
	if len(authority) == 0 {
		return nil, nil, nil, false
	}
	if k := bytes.IndexByte(origin, '#'); k >= 0 {
		origin = origin[:k] // fragments are never sent (RFC 9110 §4.2.4)
	}
	return scheme, authority, origin, true
}
