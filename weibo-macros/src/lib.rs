//! Derive macros for Weibo. Use them through the `weibo` crate
//! (`weibo::Key`, `weibo::RkyvData`), which re-exports them.
//!
//! Each derive parses its input, validates it (errors are spanned on the
//! offending token and say what to do), then expands into an impl wrapped in
//! `const _: () = { ... };` with absolute paths. On invalid input a derive
//! still emits the error and nothing else, so the user sees one message.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, Generics, Type, parse_macro_input, parse_quote};

/// Derives `weibo::Key`: a stable byte encoding of the fields in declaration
/// order (enums: the variant index as `u32` big-endian, then its fields).
///
/// Every field must itself be a `Key`. Floating-point fields are refused:
/// `0.0 == -0.0` and `NaN != NaN` leave floats without a stable identity.
#[proc_macro_derive(Key)]
pub fn derive_key(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand_key(&input) {
        Ok(tokens) => tokens.into(),
        Err(err) => err.to_compile_error().into(),
    }
}

/// Derives `weibo::Data` with the rkyv codec, for types that also derive
/// `rkyv::Archive`, `rkyv::Serialize` and `rkyv::Deserialize`.
#[proc_macro_derive(RkyvData)]
pub fn derive_rkyv_data(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    quote! {
        const _: () = {
            #[automatically_derived]
            impl #impl_generics ::weibo::Data for #ident #ty_generics #where_clause {
                fn codec_id() -> ::weibo::codec::CodecId {
                    ::weibo::codec::CodecId::new(::weibo::codec::RKYV_FORMAT, ::std::any::type_name::<Self>())
                }
                fn encode(&self, out: &mut ::std::vec::Vec<u8>) -> ::std::result::Result<(), ::weibo::codec::CodecError> {
                    ::weibo::codec::rkyv_encode(self, out)
                }
                fn decode(bytes: &[u8]) -> ::std::result::Result<Self, ::weibo::codec::CodecError> {
                    ::weibo::codec::rkyv_decode(bytes)
                }
            }
        };
    }
    .into()
}

/// Field types refused as key components, with the reason.
fn refused_type(ty: &Type) -> Option<&'static str> {
    let Type::Path(path) = ty else {
        return match ty {
            Type::Reference(_) => {
                Some("references cannot be keys: keys are owned values; use an owned type such as `String`")
            }
            _ => None,
        };
    };
    let last = path.path.segments.last()?;
    match last.ident.to_string().as_str() {
        "f32" | "f64" => Some(
            "floating-point fields cannot be part of a key: `0.0 == -0.0` and `NaN != NaN`, so a float has no stable byte identity; \
             key by an integer instead (for example fixed-point cents, or `f64::to_bits` if bit identity is really what you mean)",
        ),
        _ => None,
    }
}

fn validate_fields(fields: &Fields) -> syn::Result<()> {
    let mut errors: Option<syn::Error> = None;
    for field in fields {
        if let Some(reason) = refused_type(&field.ty) {
            let err = syn::Error::new_spanned(&field.ty, reason);
            match &mut errors {
                Some(all) => all.combine(err),
                None => errors = Some(err),
            }
        }
    }
    errors.map_or(Ok(()), Err)
}

fn add_key_bounds(generics: &Generics) -> Generics {
    let mut generics = generics.clone();
    for param in generics.type_params_mut() {
        param.bounds.push(parse_quote!(::weibo::Key));
    }
    generics
}

/// Each field's `(name, key schema)` (`""` for a positional field).
fn field_schemas(fields: &Fields) -> Vec<TokenStream2> {
    fields
        .iter()
        .map(|field| {
            let ty = &field.ty;
            let name = field.ident.as_ref().map(ToString::to_string).unwrap_or_default();
            quote_spanned! {ty.span()=> (#name.into(), <#ty as ::weibo::Key>::key_schema()) }
        })
        .collect()
}

/// Encode and decode code for one set of fields, bound to names `binding_i`.
fn field_code(fields: &Fields) -> (Vec<proc_macro2::Ident>, Vec<TokenStream2>, Vec<TokenStream2>) {
    let mut names = Vec::new();
    let mut encodes = Vec::new();
    let mut decodes = Vec::new();
    for (i, field) in fields.iter().enumerate() {
        let name = format_ident!("__weibo_field_{}", i);
        let ty = &field.ty;
        encodes.push(quote_spanned! {ty.span()=> <#ty as ::weibo::Key>::encode_key(#name, __weibo_out); });
        decodes.push(quote_spanned! {ty.span()=> <#ty as ::weibo::Key>::decode_key(__weibo_input)? });
        names.push(name);
    }
    (names, encodes, decodes)
}

/// Builds `Path { a: x, b: y }`, `Path(x, y)` or `Path` for the field shape.
fn construct(path: TokenStream2, fields: &Fields, values: &[TokenStream2]) -> TokenStream2 {
    match fields {
        Fields::Named(named) => {
            let idents = named.named.iter().filter_map(|f| f.ident.as_ref());
            quote! { #path { #(#idents: #values),* } }
        }
        Fields::Unnamed(_) => quote! { #path ( #(#values),* ) },
        Fields::Unit => path,
    }
}

/// A pattern binding the fields to `names`.
fn pattern(path: TokenStream2, fields: &Fields, names: &[proc_macro2::Ident]) -> TokenStream2 {
    match fields {
        Fields::Named(named) => {
            let idents = named.named.iter().filter_map(|f| f.ident.as_ref());
            quote! { #path { #(#idents: #names),* } }
        }
        Fields::Unnamed(_) => quote! { #path ( #(#names),* ) },
        Fields::Unit => path,
    }
}

fn expand_key(input: &DeriveInput) -> syn::Result<TokenStream2> {
    let ident = &input.ident;
    let name = ident.to_string();
    // A struct of one field encodes as that field, so it routes by the
    // field's hash (which a 64-bit integer computes without encoding).
    let mut routing = TokenStream2::new();
    let (encode_body, decode_body, schema_body) = match &input.data {
        Data::Struct(data) => {
            validate_fields(&data.fields)?;
            let (names, encodes, decodes) = field_code(&data.fields);
            let pat = pattern(quote!(#ident), &data.fields, &names);
            let build = construct(quote!(#ident), &data.fields, &decodes);
            let fields = field_schemas(&data.fields);
            if let [only] = names.as_slice() {
                routing = quote! {
                    #[inline]
                    fn routing_hash(&self, __weibo_scratch: &mut ::std::vec::Vec<u8>) -> u64 {
                        let #pat = self;
                        ::weibo::Key::routing_hash(#only, __weibo_scratch)
                    }
                };
            }
            (
                quote! { let #pat = self; #(#encodes)* },
                quote! { ::std::result::Result::Ok(#build) },
                quote! { ::weibo::codec::schema::Shape::Struct { name: #name.into(), fields: ::std::vec![#(#fields),*] } },
            )
        }
        Data::Enum(data) => {
            if data.variants.is_empty() {
                return Err(syn::Error::new_spanned(
                    ident,
                    "`#[derive(Key)]` needs at least one variant: an enum without variants has no values to key by",
                ));
            }
            let mut errors: Option<syn::Error> = None;
            for variant in &data.variants {
                if let Err(err) = validate_fields(&variant.fields) {
                    match &mut errors {
                        Some(all) => all.combine(err),
                        None => errors = Some(err),
                    }
                }
            }
            if let Some(err) = errors {
                return Err(err);
            }
            let mut encode_arms = Vec::new();
            let mut decode_arms = Vec::new();
            let mut variant_schemas = Vec::new();
            for (index, variant) in data.variants.iter().enumerate() {
                let index = u32::try_from(index)
                    .map_err(|_| syn::Error::new_spanned(variant, "`#[derive(Key)]` supports at most 2^32 variants"))?;
                let vident = &variant.ident;
                let (names, encodes, decodes) = field_code(&variant.fields);
                let pat = pattern(quote!(#ident::#vident), &variant.fields, &names);
                let build = construct(quote!(#ident::#vident), &variant.fields, &decodes);
                encode_arms.push(quote! {
                    #pat => {
                        __weibo_out.extend_from_slice(&#index.to_be_bytes());
                        #(#encodes)*
                    }
                });
                decode_arms.push(quote! { #index => ::std::result::Result::Ok(#build), });
                let vname = vident.to_string();
                let fields = field_schemas(&variant.fields);
                variant_schemas.push(quote! { (#vname.into(), ::std::vec![#(#fields),*]) });
            }
            (
                quote! { match self { #(#encode_arms)* } },
                quote! {
                    match ::weibo::key::decode_variant::<Self>(__weibo_input)? {
                        #(#decode_arms)*
                        __weibo_other => ::std::result::Result::Err(::weibo::key::KeyDecodeError::new::<Self>(
                            ::std::format!("variant index {} does not exist", __weibo_other),
                        )),
                    }
                },
                quote! {
                    ::weibo::codec::schema::Shape::Enum { name: #name.into(), variants: ::std::vec![#(#variant_schemas),*] }
                },
            )
        }
        Data::Union(data) => {
            return Err(syn::Error::new_spanned(
                data.union_token,
                "`#[derive(Key)]` cannot be used on a union: use a struct or an enum",
            ));
        }
    };
    let generics = add_key_bounds(&input.generics);
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    Ok(quote! {
        const _: () = {
            #[automatically_derived]
            impl #impl_generics ::weibo::Key for #ident #ty_generics #where_clause {
                #[allow(unused_variables)]
                fn encode_key(&self, __weibo_out: &mut ::std::vec::Vec<u8>) {
                    #encode_body
                }
                #[allow(unused_variables)]
                fn decode_key(__weibo_input: &mut &[u8]) -> ::std::result::Result<Self, ::weibo::key::KeyDecodeError> {
                    #decode_body
                }
                fn key_schema() -> ::weibo::codec::schema::Shape {
                    #schema_body
                }
                #routing
            }
        };
    })
}
