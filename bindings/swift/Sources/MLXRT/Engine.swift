import CMLXRT
import Foundation

/// A loaded model and its threads. Thread-safe: the C library allows every
/// call from any thread, and the handle never changes. Deinit cancels the
/// requests in flight (their streams end with `.done(.cancelled, _)`) and
/// joins the engine's threads.
public final class Engine: @unchecked Sendable {
    private let handle: OpaquePointer

    /// The model's facts, read when the engine was made.
    public let info: EngineInfo

    /// The library's version ("0.1.0").
    public static var version: String { String(cString: mlxrt_version_string()) }

    /// Loads the model; blocks until it is ready (call it off the main thread).
    public init(_ configuration: EngineConfiguration) throws {
        guard mlxrt_abi_version() == UInt32(MLXRT_ABI_VERSION) else {
            throw MLXRTError(status: MLXRTError.Code.unsupported.rawValue,
                             message: "mlxrt.h and the loaded libmlxrt differ in ABI version")
        }
        var strings = CStrings()
        defer { strings.release() }
        var c = mlxrt_engine_config()
        mlxrt_engine_config_init(&c)
        c.model_path = strings.add(configuration.modelPath)
        c.device = configuration.device.rawValue
        c.max_in_flight = configuration.maxInFlight
        c.max_rows = configuration.maxRows
        c.prefill_chunk = configuration.prefillChunk
        c.kv_budget = configuration.kvBudget
        c.seed = configuration.seed
        c.prompt_cache_bytes = configuration.promptCacheBytes
        c.prompt_cache_dir = strings.add(configuration.promptCacheDirectory)
        c.draft_model_path = strings.add(configuration.draftModelPath)
        var engine: OpaquePointer?
        var error: OpaquePointer?
        let status = mlxrt_engine_create(&c, &engine, &error)
        try MLXRTError.check(status, error)
        var info = mlxrt_engine_info()
        info.struct_size = MemoryLayout<mlxrt_engine_info>.size
        let infoStatus = mlxrt_engine_get_info(engine, &info, &error)
        if infoStatus != 0 {
            mlxrt_engine_destroy(engine)  // deinit does not run for a failed init
            try MLXRTError.check(infoStatus, error)
        }
        self.info = EngineInfo(info)  // copies the strings and ids
        handle = engine!
    }

    deinit {
        mlxrt_engine_destroy(handle)
    }

    /// Streams the answer to a conversation, rendered with the model's chat
    /// template. Ending the stream early (leaving the `for try await` loop,
    /// or cancelling its task) cancels the request.
    public func generate(messages: [Message], parameters: GenerateParameters = GenerateParameters())
        -> AsyncThrowingStream<Event, Error>
    {
        stream(parameters, media: messages.flatMap { $0.images.map(Medium.init) + $0.audio.map(Medium.init) }) { strings, p in
            p.messages_json = strings.add(try chatJSON(messages))
        }
    }

    /// Streams the continuation of raw prompt text (special-token text is parsed).
    public func generate(prompt: String, parameters: GenerateParameters = GenerateParameters())
        -> AsyncThrowingStream<Event, Error>
    {
        stream(parameters) { strings, p in p.prompt = strings.add(prompt) }
    }

    /// The engine's counters now.
    public var stats: EngineStats {
        var s = mlxrt_engine_stats()
        s.struct_size = MemoryLayout<mlxrt_engine_stats>.size
        mlxrt_engine_get_stats(handle, &s, nil)  // only fails for a NULL engine
        return EngineStats(s)
    }

    /// The token ids of `text` (no BOS added); with `parseSpecial`,
    /// special-token text such as `<|im_start|>` becomes its id.
    public func tokenize(_ text: String, parseSpecial: Bool = false) throws -> [UInt32] {
        var tokens: OpaquePointer?
        var error: OpaquePointer?
        let status = mlxrt_tokenize(handle, text, parseSpecial ? 1 : 0, &tokens, &error)
        try MLXRTError.check(status, error)
        return takeTokens(tokens)
    }

    /// The text of token ids (bytes that are not valid UTF-8 become U+FFFD);
    /// with `skipSpecial`, special tokens produce no text.
    public func detokenize(_ tokens: [UInt32], skipSpecial: Bool = false) throws -> String {
        var text: UnsafeMutablePointer<CChar>?
        var error: OpaquePointer?
        let status = tokens.withUnsafeBufferPointer { ids in
            mlxrt_detokenize(handle, ids.baseAddress, ids.count, skipSpecial ? 1 : 0, &text, &error)
        }
        try MLXRTError.check(status, error)
        return takeString(text)
    }

    /// Renders a conversation with the model's chat template (and the `tools`
    /// and `chat_template_kwargs` of `optionsJSON`). Messages with images
    /// throw: `mlxrt_render_chat` takes no images.
    public func renderChat(messages: [Message], optionsJSON: String? = nil) throws -> RenderedChat {
        var strings = CStrings()
        defer { strings.release() }
        let json = try chatJSON(messages)
        var text: UnsafeMutablePointer<CChar>?
        var tokens: OpaquePointer?
        var error: OpaquePointer?
        let status = mlxrt_render_chat(handle, strings.add(json), strings.add(optionsJSON), &text, &tokens, &error)
        try MLXRTError.check(status, error)
        return RenderedChat(text: takeString(text), tokens: takeTokens(tokens))
    }

    // MARK: - submission

    /// The request's context, handed to C as user_data: retained by
    /// `Unmanaged` at submit and released by `user_data_free`, which the C
    /// library calls exactly once, after the last event.
    fileprivate final class Context: @unchecked Sendable {
        let continuation: AsyncThrowingStream<Event, Error>.Continuation
        init(_ continuation: AsyncThrowingStream<Event, Error>.Continuation) { self.continuation = continuation }
    }

    /// A request handle; freeing it does not cancel the request.
    private final class Request: @unchecked Sendable {
        let handle: OpaquePointer
        init(_ handle: OpaquePointer) { self.handle = handle }
        func cancel() { mlxrt_request_cancel(handle, nil) }
        deinit { mlxrt_request_free(handle) }
    }

    /// `input` sets the request's input fields; it runs before this returns.
    /// `media` are the `mlxrt_media` entries the messages refer to.
    private func stream(
        _ parameters: GenerateParameters,
        media: [Medium] = [],
        input: (inout CStrings, inout mlxrt_request_params) throws -> Void
    ) -> AsyncThrowingStream<Event, Error> {
        AsyncThrowingStream { continuation in
            let context = Unmanaged.passRetained(Context(continuation))
            do {
                let request = try submit(parameters, media, context.toOpaque(), input)
                // Leaving the loop or cancelling the task terminates the stream.
                continuation.onTermination = { @Sendable _ in request.cancel() }
            } catch {
                context.release()  // a failed submit keeps nothing and calls nothing
                continuation.finish(throwing: error)
            }
        }
    }

    private func submit(
        _ parameters: GenerateParameters,
        _ media: [Medium],
        _ context: UnsafeMutableRawPointer,
        _ input: (inout CStrings, inout mlxrt_request_params) throws -> Void
    ) throws -> Request {
        var strings = CStrings()
        defer { strings.release() }  // mlxrt copies every input during the call
        var p = mlxrt_request_params()
        mlxrt_request_params_init(&p)
        try input(&strings, &p)
        p.max_tokens = parameters.maxTokens
        p.temperature = parameters.temperature
        p.top_p = parameters.topP
        p.top_k = parameters.topK
        p.min_p = parameters.minP
        p.repetition_penalty = parameters.repetitionPenalty
        p.use_seed = parameters.seed == nil ? 0 : 1
        p.seed = parameters.seed ?? 0
        let formatted = parameters.responseFormat?.merged(into: parameters.optionsJSON) ?? parameters.optionsJSON
        p.options_json = strings.add(parameters.speculation?.merged(into: formatted) ?? formatted)
        p.cache_namespace = strings.add(parameters.cacheNamespace)
        p.no_prompt_cache = parameters.usesPromptCache ? 0 : 1
        p.thinking = parameters.thinking.map { $0 ? Int32(1) : Int32(0) } ?? -1  // -1: the template's default
        p.logprobs = parameters.logprobs ? 1 : 0
        p.top_logprobs = parameters.topLogprobs
        let stops: [UnsafePointer<CChar>?] = parameters.stop.map { strings.add($0) }

        var request: OpaquePointer?
        var error: OpaquePointer?
        let status = withMedia(media) { media -> Int32 in
            stops.withUnsafeBufferPointer { stopList -> Int32 in
                p.stop = stops.isEmpty ? nil : stopList.baseAddress
                p.n_stop = stops.count
                p.media = media.isEmpty ? nil : media.baseAddress
                p.n_media = media.count
                return mlxrt_request_submit(handle, &p, onEvent, context, releaseContext, &request, &error)
            }
        }
        try MLXRTError.check(status, error)
        return Request(request!)
    }
}

/// Runs on the engine's delivery thread; copies the event (valid only during
/// the call) into the stream.
private let onEvent: mlxrt_event_fn = { userData, event in
    guard let userData, let event else { return }
    let continuation = Unmanaged<Engine.Context>.fromOpaque(userData).takeUnretainedValue().continuation
    let ev = event.pointee
    switch ev.kind {
    case 1:  // MLXRT_EVENT_KIND_DELTA
        let bytes = UnsafeRawBufferPointer(start: UnsafeRawPointer(ev.text), count: ev.text_len)
        let text = String(decoding: bytes, as: UTF8.self)
        let tokens = Array(UnsafeBufferPointer(start: ev.tokens, count: ev.n_tokens))
        let logprobs = UnsafeBufferPointer(start: ev.logprobs, count: ev.n_logprobs).map { lp in
            TokenLogprob(token: lp.token, logprob: lp.logprob,
                         top: UnsafeBufferPointer(start: lp.top, count: lp.n_top).map {
                             TokenLogprob.Alternative(token: $0.token, logprob: $0.logprob)
                         })
        }
        let reasoning = ev.channel == 1  // MLXRT_CHANNEL_REASONING
        continuation.yield(reasoning ? .reasoning(text, tokens: tokens, logprobs: logprobs)
                                     : .text(text, tokens: tokens, logprobs: logprobs))
    case 4:  // MLXRT_EVENT_KIND_TOOL_CALL
        let call = ToolCall(id: String(cString: ev.tool_call_id), name: String(cString: ev.tool_name),
                            arguments: String(cString: ev.tool_arguments))
        continuation.yield(.toolCall(call))
    case 2:  // MLXRT_EVENT_KIND_DONE
        continuation.yield(.done(FinishReason(rawValue: ev.finish_reason) ?? .stop, Usage(ev.usage)))
        continuation.finish()
    case 3:  // MLXRT_EVENT_KIND_ERROR
        continuation.finish(throwing: MLXRTError(status: ev.error_status, message: String(cString: ev.error_message)))
    default:
        break  // a kind added after this package; not terminal
    }
}

/// user_data_free: balances the `passRetained` of submit.
private let releaseContext: mlxrt_free_fn = { userData in
    guard let userData else { return }
    Unmanaged<Engine.Context>.fromOpaque(userData).release()
}

/// The messages as the JSON array the C API takes. A message with media has
/// content parts: `{"type": "image", "media": K}` for each image, then
/// `{"type": "audio", "media": K}` for each clip, K counting the media of all
/// messages in order (their `mlxrt_media` entries), then its text.
private func chatJSON(_ messages: [Message]) throws -> String {
    struct Part: Encodable {
        var type: String
        var text: String?
        var media: Int?
    }
    struct Wire: Encodable {
        var role: String
        var text: String
        var parts: [Part]?
        enum CodingKeys: String, CodingKey { case role, content }
        func encode(to encoder: Encoder) throws {
            var c = encoder.container(keyedBy: CodingKeys.self)
            try c.encode(role, forKey: .role)
            if let parts = parts {
                try c.encode(parts, forKey: .content)
            } else {
                try c.encode(text, forKey: .content)
            }
        }
    }
    var wire: [Wire] = []
    var k = 0
    for m in messages {
        var parts: [Part]? = nil
        if !m.images.isEmpty || !m.audio.isEmpty {
            let kinds = Array(repeating: "image", count: m.images.count) + Array(repeating: "audio", count: m.audio.count)
            parts = kinds.enumerated().map { Part(type: $0.element, text: nil, media: k + $0.offset) }
            parts?.append(Part(type: "text", text: m.content, media: nil))
            k += kinds.count
        }
        wire.append(Wire(role: m.role, text: m.content, parts: parts))
    }
    return String(decoding: try JSONEncoder().encode(wire), as: UTF8.self)
}

/// One `mlxrt_media` entry's fields, from an image or an audio clip.
struct Medium {
    var kind: Int32
    var format: Int32
    var width = 0, height = 0, bytesPerRow = 0, sampleRate = 0
    var data: Data

    init(_ image: ImageInput) {
        kind = Int32(MLXRT_MEDIA_IMAGE)
        format = image.pixelFormat?.rawValue ?? Int32(MLXRT_MEDIA_ENCODED)
        width = image.width
        height = image.height
        bytesPerRow = image.bytesPerRow
        data = image.data
    }

    init(_ audio: AudioInput) {
        kind = Int32(MLXRT_MEDIA_AUDIO)
        format = audio.sampleRate == nil ? Int32(MLXRT_MEDIA_ENCODED) : Int32(MLXRT_AUDIO_F32)
        sampleRate = audio.sampleRate ?? 0
        data = audio.data
    }
}

/// Calls `body` with the media's `mlxrt_media` entries, which point into
/// their `Data` and are valid only during the call.
private func withMedia(_ media: [Medium], _ body: (UnsafeBufferPointer<mlxrt_media>) -> Int32) -> Int32 {
    var entries: [mlxrt_media] = []
    func add(_ i: Int) -> Int32 {
        guard i < media.count else { return entries.withUnsafeBufferPointer(body) }
        let item = media[i]
        return item.data.withUnsafeBytes { (bytes: UnsafeRawBufferPointer) -> Int32 in
            var m = mlxrt_media()
            m.struct_size = MemoryLayout<mlxrt_media>.size
            m.kind = item.kind
            m.format = item.format
            // Out-of-range sizes become values mlxrt refuses rather than wrapping.
            m.width = UInt32(clamping: item.width)
            m.height = UInt32(clamping: item.height)
            m.stride = max(item.bytesPerRow, 0)
            m.sample_rate = UInt32(clamping: item.sampleRate)
            m.bytes = bytes.baseAddress?.assumingMemoryBound(to: UInt8.self)
            m.n_bytes = bytes.count
            entries.append(m)
            return add(i + 1)
        }
    }
    return add(0)
}

/// Moves token ids the library returned into an array and frees them.
private func takeTokens(_ tokens: OpaquePointer?) -> [UInt32] {
    defer { mlxrt_tokens_free(tokens) }
    return Array(UnsafeBufferPointer(start: mlxrt_tokens_data(tokens), count: mlxrt_tokens_len(tokens)))
}

/// Moves a string the library returned into a String and frees it.
private func takeString(_ text: UnsafeMutablePointer<CChar>?) -> String {
    defer { mlxrt_string_free(text) }
    return text.map { String(cString: $0) } ?? ""
}

/// C copies of strings, alive until `release()`.
struct CStrings {
    private var owned: [UnsafeMutablePointer<CChar>] = []

    mutating func add(_ string: String) -> UnsafePointer<CChar> {
        let copy = strdup(string)!
        owned.append(copy)
        return UnsafePointer(copy)
    }

    mutating func add(_ string: String?) -> UnsafePointer<CChar>? {
        string.map { add($0) }
    }

    func release() {
        owned.forEach { free($0) }
    }
}
