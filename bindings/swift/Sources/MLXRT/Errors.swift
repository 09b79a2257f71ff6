import CMLXRT

/// A failure reported by mlxrt: the C library's status and its message.
public struct MLXRTError: Error, Sendable, Equatable, CustomStringConvertible {
    /// `mlxrt_status` values; never renumbered.
    public enum Code: Int32, Sendable {
        case invalidArgument = 1
        case invalidUTF8 = 2
        case invalidJSON = 3
        case modelLoad = 4
        case unsupported = 5
        case mlx = 6
        case busy = 7
        case enginePoisoned = 8
        case io = 9
        case `internal` = 10
        case timeout = 11
        case aborted = 12
        case endOfStream = 13
    }

    /// The status as the library returned it (a newer library may add codes).
    public let status: Int32
    public let message: String

    /// The status as a known code; `.internal` for one this package predates.
    public var code: Code { Code(rawValue: status) ?? .internal }

    public init(status: Int32, message: String) {
        self.status = status
        self.message = message
    }

    public var description: String {
        "\(String(cString: mlxrt_status_name(status))): \(message)"
    }

    /// Turns a C status and error object into a thrown error (freeing the object).
    static func check(_ status: Int32, _ error: OpaquePointer?) throws {
        guard status != 0 else { return }  // MLXRT_STATUS_OK
        defer { mlxrt_error_free(error) }
        let message = error.map { String(cString: mlxrt_error_message($0)) }
        throw MLXRTError(status: status, message: message ?? String(cString: mlxrt_status_name(status)))
    }
}
