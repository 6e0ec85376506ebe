package provbase

import "github.com/tensorlane/tensorlane/fabric/internal/peerauth"

// ErrorAnswer encodes a handler's error for the wire: its peerauth status
// code (one byte: which fabric sentinel it matches) and its text, cut to
// peerauth.MaxMessage.
func ErrorAnswer(err error) []byte {
	text := err.Error()
	if len(text) > peerauth.MaxMessage {
		text = text[:peerauth.MaxMessage]
	}
	return append([]byte{peerauth.StatusFor(err)}, text...)
}

// RemoteError decodes an ErrorAnswer into an error that matches the
// fabric sentinel it stands for.
func RemoteError(p []byte) error {
	if len(p) == 0 {
		return peerauth.StatusError(peerauth.StatusInternal, "empty error")
	}
	return peerauth.StatusError(p[0], string(p[1:]))
}
