#if canImport(CoreGraphics)
import CoreGraphics
import Foundation

extension ImageInput {
    /// `image` drawn into BGRA8 pixels (sRGB; transparent areas over white,
    /// as mlxrt composites transparent files), or nil if Core Graphics cannot
    /// draw it. For a photo from UIKit/AppKit: `ImageInput(cgImage: ui.cgImage!)`.
    public init?(cgImage image: CGImage) {
        let width = image.width, height = image.height, bytesPerRow = width * 4
        guard width > 0, height > 0, let space = CGColorSpace(name: CGColorSpace.sRGB) else { return nil }
        var data = Data(count: bytesPerRow * height)
        let drawn = data.withUnsafeMutableBytes { (buffer: UnsafeMutableRawBufferPointer) -> Bool in
            let info = CGImageAlphaInfo.noneSkipFirst.rawValue | CGBitmapInfo.byteOrder32Little.rawValue
            guard let context = CGContext(data: buffer.baseAddress, width: width, height: height,
                                          bitsPerComponent: 8, bytesPerRow: bytesPerRow, space: space,
                                          bitmapInfo: info) else { return false }
            let rect = CGRect(x: 0, y: 0, width: width, height: height)
            context.setFillColor(CGColor(red: 1, green: 1, blue: 1, alpha: 1))
            context.fill(rect)
            context.draw(image, in: rect)
            return true
        }
        guard drawn else { return nil }
        self = .pixels(data, width: width, height: height, bytesPerRow: bytesPerRow, format: .bgra8)
    }
}
#endif
