// Package tcodec is tensorlane's lossless tensor codec for slow links.
//
// Data is cut into blocks of at most MaxBlock bytes. Every block is
// self-describing: a 20-byte header carries the codec, the element size,
// the raw and encoded lengths and an XXH3-64 checksum of the raw bytes, so blocks can
// be encoded, sent and decoded independently (on several goroutines, while
// the network carries the previous one), and a damaged block is detected
// (errors match ErrCorrupt; fabric/tcp reports them as fabric.ErrCorrupt).
//
// Codecs:
//   - Raw: the bytes as they are (the header only adds the checksum).
//   - Planes: for floating-point tensors. The block is split into byte
//     planes (bf16/fp16: the high byte holds sign and exponent, the low byte
//     mantissa; fp32: four planes) and each plane is entropy-coded with huff0
//     when that shrinks it, kept raw otherwise. Exponent planes of trained
//     weights have few distinct values and shrink to about half; mantissa
//     planes are close to random and stay raw. Generic LZ codecs gain almost
//     nothing on such data, which is why this codec exists.
//   - S2: klauspost's s2 (a faster snappy) for integer and unknown data.
//
// The decoder checks every length before it allocates or copies, never
// panics on garbage, and allocates at most a few MaxBlock-sized scratch
// buffers per Decoder.
package tcodec
