package api

import (
	"context"
	"net/url"
)

// The capture routes: a writable kernel cache volume's compiled kernels,
// and the layers kept for capture after their pods went.

// CaptureSource asks where a volume's compiled kernels are (the volume
// ID, or namespace/pod of the pod that mounts it).
func (c *Client) CaptureSource(ctx context.Context, volume string) (*CaptureSource, error) {
	var s CaptureSource
	return &s, c.call(ctx, "GET", "/v1/csi/capture?volume="+url.QueryEscape(volume), nil, &s)
}

// Captured tells the daemon that a capture of volume (as CaptureSource
// named it) was pushed: a kept layer goes; a published volume's layer is
// kept at unpublish only for what the pod writes after this.
func (c *Client) Captured(ctx context.Context, volume string) error {
	return c.call(ctx, "POST", "/v1/csi/captured?volume="+url.QueryEscape(volume), nil, nil)
}

// KeptLayers lists the writable kernel cache layers kept past their
// volumes for capture, oldest first.
func (c *Client) KeptLayers(ctx context.Context) ([]KeptLayer, error) {
	var out []KeptLayer
	return out, c.call(ctx, "GET", "/v1/csi/kept", nil, &out)
}

// DropKeptLayer removes a kept layer without capturing it.
func (c *Client) DropKeptLayer(ctx context.Context, volume string) error {
	return c.call(ctx, "DELETE", "/v1/csi/kept?volume="+url.QueryEscape(volume), nil, nil)
}
