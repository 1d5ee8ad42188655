//go:build !linux

package bridge

import "net"

// listenConfig applies keepalive to each accepted connection.
func listenConfig(ka net.KeepAliveConfig) net.ListenConfig {
	return net.ListenConfig{KeepAliveConfig: ka}
}
